//! One ingest run, step by step (see the crate documentation).

use crate::lock::IngestLock;
use crate::INGEST_TASK_KINDS;
use futures::StreamExt;
use opledger_domain::events::BatchItemSpec;
use opledger_domain::projections::{OperationRow, ProcessingStateRow};
use opledger_domain::{BatchId, IngestionStage, MediaId, OperationId, OperationStatus};
use opledger_engine::{CommandContext, Engine, EngineError, FileObservation, IngestionClaim, Registration};
use opledger_media::{
    hash_file, read_metadata, resolver_fn, ExecutionCounter, MetadataTask, PerceptualHashTask, Settler, ThumbnailTask,
};
use opledger_store::Store;
use opledger_worker::{ComputeThreads, PoolError, TaskError, WorkerPool};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};
use thiserror::Error;

/// Files per transaction when starting, moving and finishing ingestions.
const CHUNK: usize = 250;

/// Files registered before the first tasks are requested: few, so the image
/// threads start on tasks while the next, larger chunks are read.
const FIRST_CHUNK: usize = 32;

/// Files whose task states one poll reads at a time (see [`finish_settled`]).
const SETTLE_WINDOW: usize = 64;

/// Claims the pool holds per image worker: enough that the compute threads
/// always find work queued while other tasks' claims and outcomes commit.
const CLAIMS_PER_WORKER: usize = 32;
const MAX_SLOTS: usize = 128;

/// How an ingest runs.
#[derive(Debug, Clone)]
pub struct IngestOptions {
    /// The folder to ingest, walked recursively.
    pub root: PathBuf,
    pub batch_name: Option<String>,
    /// Local workers running the image tasks (at least 1).
    pub workers: usize,
    /// Where thumbnails are written (`<revision>.png`).
    pub thumbnails_dir: PathBuf,
    /// The lock file that keeps ingests of one database one at a time.
    pub lock_path: PathBuf,
    /// Paths never ingested (the database and its companion files): any
    /// file at or under one of them is left alone.
    pub exclude: Vec<PathBuf>,
    /// How long a file's size and modification time must stay unchanged
    /// before it is read.
    pub settle_quiet: Duration,
    /// The lease of the workers' claims; a crashed run's claims are taken
    /// over by recovery this long after it died.
    pub lease: Duration,
}

impl IngestOptions {
    pub fn new(root: impl Into<PathBuf>, thumbnails_dir: impl Into<PathBuf>, lock_path: impl Into<PathBuf>) -> Self {
        IngestOptions {
            root: root.into(),
            batch_name: None,
            workers: std::thread::available_parallelism().map_or(2, usize::from),
            thumbnails_dir: thumbnails_dir.into(),
            lock_path: lock_path.into(),
            exclude: Vec::new(),
            settle_quiet: Duration::from_millis(500),
            lease: Duration::from_secs(10),
        }
    }
}

/// Told as the run goes; implementations draw a progress bar or print lines.
pub trait IngestProgress: Send + Sync {
    /// The folder was walked: `total` files, of which `unchanged` need nothing.
    fn started(&self, total: usize, unchanged: usize);
    /// Files settled so far (done, failed or unchanged), and how many failed.
    fn settled(&self, settled: usize, failed: usize);
    fn finished(&self);
}

/// Reports nothing.
pub struct NoProgress;

impl IngestProgress for NoProgress {
    fn started(&self, _: usize, _: usize) {}
    fn settled(&self, _: usize, _: usize) {}
    fn finished(&self) {}
}

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

/// Where each media item registered by this run is on disk.
type KnownPaths = Arc<std::sync::RwLock<BTreeMap<MediaId, PathBuf>>>;

/// A file of this run that is being processed.
struct InFlight {
    claim: IngestionClaim,
    path: PathBuf,
    media_id: Option<MediaId>,
    tasks: Vec<OperationId>,
}

/// Runs one ingest of `options.root` to the end.
pub async fn ingest<S: Store>(
    engine: Engine<S>,
    options: IngestOptions,
    progress: Arc<dyn IngestProgress>,
) -> Result<IngestSummary, IngestError> {
    let started = Instant::now();
    let root = std::fs::canonicalize(&options.root)
        .map_err(|error| IngestError::Io(format!("cannot read folder {}: {error}", options.root.display())))?;
    if !root.is_dir() {
        return Err(IngestError::Io(format!("{} is not a folder", root.display())));
    }
    std::fs::create_dir_all(&options.thumbnails_dir)
        .map_err(|error| IngestError::Io(format!("cannot create {}: {error}", options.thumbnails_dir.display())))?;
    let _lock = IngestLock::acquire(&options.lock_path, || {
        tracing::warn!("another ingest holds {}; waiting for it", options.lock_path.display())
    })
    .map_err(|error| IngestError::Io(format!("locking {}: {error}", options.lock_path.display())))?;
    // With the lock held no other ingest runs, so every temporary
    // thumbnail in the folder is one a killed run left between writing it
    // and renaming it into place: its claim is dead, and the task runs
    // again under a new claim.
    let abandoned = opledger_worker::remove_abandoned_outputs(&options.thumbnails_dir, |_| false)
        .map_err(|error| IngestError::Io(format!("cleaning {}: {error}", options.thumbnails_dir.display())))?;
    if abandoned > 0 {
        tracing::info!(abandoned, "removed temporary thumbnails a killed run left behind");
    }
    let run = engine.ids().next();
    let worker = format!("ingest-{}", run.simple());
    let context = CommandContext::actor(worker.clone()).with_correlation(format!("ingest-{run}"));
    let mut exclude: Vec<PathBuf> = options
        .exclude
        .iter()
        .map(|path| std::fs::canonicalize(path).unwrap_or_else(|_| path.clone()))
        .collect();
    exclude.push(std::fs::canonicalize(&options.thumbnails_dir).unwrap_or_else(|_| options.thumbnails_dir.clone()));
    exclude.push(std::fs::canonicalize(&options.lock_path).unwrap_or_else(|_| options.lock_path.clone()));

    // 1. Walk, and compare with what the ledger knows.
    let files = walk(&root, &exclude)?;
    let paths: Vec<String> = files.iter().map(|(_, file)| file.path.clone()).collect();
    let known = engine.ingestions_by_path(&paths).await?;
    let media = engine.media_by_path(&paths).await?;
    let mut summary = IngestSummary {
        batch_id: None,
        files: files.len(),
        new: 0,
        unchanged: 0,
        changed: 0,
        failed: 0,
        missing: 0,
        operations_created: 0,
        review_entries: Vec::new(),
        tasks_run: 0,
        wall_seconds: 0.0,
    };
    let mut fresh = Vec::new();
    let mut resume = Vec::new();
    let mut unchanged_items = Vec::new();
    for (path, observation) in &files {
        match known.get(&observation.path) {
            Some(operation) if !operation.status.is_terminal() => {
                resume.push(operation.operation_id);
                if media.contains_key(&observation.path) {
                    summary.changed += 1;
                } else {
                    summary.new += 1;
                }
            }
            Some(operation)
                if operation.status != OperationStatus::MissingConfirmed && same_file(operation, observation) =>
            {
                summary.unchanged += 1;
                unchanged_items.push(BatchItemSpec {
                    operation_id: operation.operation_id,
                    label: path.display().to_string(),
                });
            }
            _ if media.contains_key(&observation.path) => {
                summary.changed += 1;
                fresh.push(observation.clone());
            }
            _ => {
                summary.new += 1;
                fresh.push(observation.clone());
            }
        }
    }
    // Files the ledger ingested under this folder that are gone.
    let on_disk: BTreeSet<&str> = files.iter().map(|(_, file)| file.path.as_str()).collect();
    let root_text = root.display().to_string();
    // The ledger's paths are listed once (one short column per
    // operation); only those under the folder and not on disk are looked up.
    let candidates: Vec<String> = engine
        .operation_paths()
        .await?
        .into_iter()
        .filter(|path| Path::new(path).starts_with(&root_text) && !on_disk.contains(path.as_str()))
        .collect();
    let gone: Vec<FileObservation> = engine
        .ingestions_by_path(&candidates)
        .await?
        .into_values()
        .filter(|operation| operation.status != OperationStatus::MissingConfirmed)
        .filter_map(|operation| operation.path)
        .map(|path| FileObservation {
            path,
            byte_size: 0,
            modified_ns: 0,
        })
        .collect();
    progress.started(files.len(), summary.unchanged);
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        files = files.len(),
        "walked"
    );

    // 2. Start ingestions, record the gone, and the batch over the folder.
    // The run holds its ingestions for as long as it holds the lock; the
    // lease only records that (the lock, not the lease, proves it alive).
    const HELD_MS: i64 = 86_400_000;
    let mut claims = Vec::new();
    let resumed = resume.len();
    for chunk in fresh.chunks(CHUNK) {
        claims.extend(
            engine
                .begin_ingestions(&context, &worker, HELD_MS, chunk.to_vec(), Vec::new())
                .await?,
        );
    }
    for chunk in resume.chunks(CHUNK) {
        claims.extend(
            engine
                .begin_ingestions(&context, &worker, HELD_MS, Vec::new(), chunk.to_vec())
                .await?,
        );
    }
    summary.operations_created += claims.len() - resumed;
    let mut missing_items = Vec::new();
    for chunk in gone.chunks(CHUNK) {
        for (operation_id, file) in engine
            .confirm_missing_files(&context, chunk.to_vec())
            .await?
            .into_iter()
            .zip(chunk)
        {
            missing_items.push(BatchItemSpec {
                operation_id,
                label: file.path.clone(),
            });
        }
    }
    summary.missing = missing_items.len();
    summary.operations_created += missing_items.len();
    let mut items: Vec<BatchItemSpec> = claims
        .iter()
        .map(|claim| BatchItemSpec {
            operation_id: claim.operation_id,
            label: claim.path.clone(),
        })
        .collect();
    items.extend(unchanged_items);
    items.extend(missing_items);
    if !items.is_empty() {
        let batch_id = BatchId(engine.ids().next());
        let name = options
            .batch_name
            .clone()
            .unwrap_or_else(|| format!("ingest {}", root.display()));
        engine
            .create_batch_over(&context, batch_id, &name, "ingestion", items, true)
            .await?;
        summary.batch_id = Some(batch_id);
    }

    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "ingestions and batch started"
    );
    // 3. The workers, in the background until every file has settled.
    let executions: ExecutionCounter = Arc::new(AtomicU64::new(0));
    // Paths of the files this run registered, as registration recorded
    // them: a task finds its file without a read of the registry. Media
    // this run did not register (a resumed run's) are looked up.
    let known_paths: KnownPaths = Arc::new(std::sync::RwLock::new(BTreeMap::new()));
    let resolver_engine = engine.clone();
    let resolver_paths = known_paths.clone();
    let resolver = resolver_fn(move |media_id: MediaId| {
        let engine = resolver_engine.clone();
        let known = resolver_paths
            .read()
            .ok()
            .and_then(|paths| paths.get(&media_id).cloned());
        async move {
            if let Some(path) = known {
                return Ok(path);
            }
            engine
                .media(media_id)
                .await
                .map(|media| PathBuf::from(media.path))
                .map_err(|error| TaskError::retryable(format!("finding media {media_id}: {error}")))
        }
    });
    // `workers` threads do the image work (the CPU's share), taking the
    // tasks' closures in turn; the pool holds several times as many claims,
    // so a task's two durable commits (claim, completion) overlap other
    // tasks' work and group-commit with theirs instead of leaving the CPU
    // idle while the disk syncs.
    let compute = ComputeThreads::new(options.workers, "opledger-image")
        .map_err(|error| IngestError::Io(format!("starting the image threads: {error}")))?;
    let slots = (options.workers.max(1) * CLAIMS_PER_WORKER).min(MAX_SLOTS);
    let pool = WorkerPool::builder(engine.clone(), worker.clone())
        .task(
            MetadataTask::new(resolver.clone())
                .with_counter(executions.clone())
                .on_compute_threads(compute.clone()),
        )
        .task(
            ThumbnailTask::new(resolver.clone(), options.thumbnails_dir.clone())
                .with_counter(executions.clone())
                .on_compute_threads(compute.clone()),
        )
        .task(
            PerceptualHashTask::new(resolver)
                .with_counter(executions.clone())
                .on_compute_threads(compute.clone()),
        )
        .workers(slots)
        .lease(options.lease)
        .heartbeat_interval(options.lease / 4)
        .recovery_interval(Duration::from_secs(1))
        .idle_poll(Duration::from_millis(50))
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let pool_run = tokio::spawn(async move {
        pool.run_until(async move {
            let _ = stopped.await;
        })
        .await
    });

    // 4. Each file through its stages; then wait for its tasks.
    let settled_count = summary.unchanged;
    let result = drive(
        &engine,
        &context,
        &FileReading {
            settler: Settler::new(options.settle_quiet).with_poll(options.settle_quiet / 5),
            compute: compute.clone(),
        },
        claims,
        settled_count,
        progress.as_ref(),
        &known_paths,
    )
    .await;
    let _ = stop.send(());
    let pool_report = pool_run
        .await
        .map_err(|error| IngestError::Io(format!("the worker pool panicked: {error}")))??;
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        ?pool_report,
        "every file settled"
    );
    let (created_tasks, failed) = result?;
    summary.operations_created += created_tasks;
    summary.failed = failed;
    summary.tasks_run = executions.load(Ordering::SeqCst);
    tracing::debug!(?pool_report, "worker pool finished");

    // 5. What needs a person, among this folder's files.
    // Entries that name no path name their media item: the item's path
    // is the entry's when the item is the one found at that path.
    let entries = engine.review_entries().await?;
    let unnamed: BTreeSet<MediaId> = entries
        .iter()
        .filter(|entry| entry.path.is_none())
        .filter_map(|entry| entry.media_id)
        .collect();
    let unnamed: Vec<MediaId> = unnamed.into_iter().collect();
    let media_paths: BTreeSet<String> = engine
        .media_by_id(&unnamed)
        .await?
        .into_values()
        .map(|media| media.path)
        .filter(|path| Path::new(path).starts_with(&root_text))
        .collect();
    let media_paths: Vec<String> = media_paths.into_iter().collect();
    let media_ids: BTreeMap<MediaId, String> = engine
        .media_by_path(&media_paths)
        .await?
        .into_iter()
        .map(|(path, media)| (media.media_id, path))
        .collect();
    for entry in entries {
        let path = entry
            .path
            .clone()
            .or_else(|| entry.media_id.and_then(|id| media_ids.get(&id).cloned()));
        let ours = path
            .as_deref()
            .is_some_and(|path| Path::new(path).starts_with(&root_text));
        if ours {
            summary.review_entries.push(ReviewEntry {
                entry_id: entry.entry_id,
                path,
                kind: entry.kind,
                reason_code: entry.reason_code,
                detail: entry.detail,
            });
        }
    }
    progress.finished();
    summary.wall_seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// Whether an ingestion's recorded observation is this file as it is now.
fn same_file(operation: &OperationRow, observation: &FileObservation) -> bool {
    serde_json::from_str::<Value>(&operation.inputs)
        .ok()
        .is_some_and(|inputs| {
            inputs["byte_size"] == json!(observation.byte_size)
                && inputs["modified_ns"] == json!(observation.modified_ns)
        })
}

/// Every regular file under `root`, sorted by path, except the excluded.
fn walk(root: &Path, exclude: &[PathBuf]) -> Result<Vec<(PathBuf, FileObservation)>, IngestError> {
    let mut found = Vec::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let entries = std::fs::read_dir(&folder)
            .map_err(|error| IngestError::Io(format!("cannot read folder {}: {error}", folder.display())))?;
        for entry in entries {
            let entry = entry.map_err(|error| IngestError::Io(format!("reading {}: {error}", folder.display())))?;
            let path = entry.path();
            if exclude.iter().any(|excluded| path.starts_with(excluded)) || is_companion(&path, exclude) {
                continue;
            }
            let kind = entry
                .file_type()
                .map_err(|error| IngestError::Io(format!("reading {}: {error}", path.display())))?;
            if kind.is_dir() {
                folders.push(path);
            } else if kind.is_file() {
                // A file that vanished between listing and stat is not there.
                let Ok(metadata) = entry.metadata() else { continue };
                let modified_ns = metadata
                    .modified()
                    .ok()
                    .and_then(|time| time.duration_since(UNIX_EPOCH).ok())
                    .map_or(0, |since| i64::try_from(since.as_nanos()).unwrap_or(i64::MAX));
                found.push((
                    path.clone(),
                    FileObservation {
                        path: path.display().to_string(),
                        byte_size: i64::try_from(metadata.len()).unwrap_or(i64::MAX),
                        modified_ns,
                    },
                ));
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(found)
}

/// The database's own companions (`ledger.db-wal`, `-shm`, `-journal`).
fn is_companion(path: &Path, exclude: &[PathBuf]) -> bool {
    let text = path.display().to_string();
    exclude.iter().any(|excluded| {
        let excluded = excluded.display().to_string();
        text.starts_with(&excluded) && text[excluded.len()..].starts_with('-')
    })
}

/// How a run reads files: waiting for those still being written, then
/// hashing and parsing on the image threads.
struct FileReading {
    settler: Settler,
    compute: ComputeThreads,
}

/// Moves every claimed file through its stages, runs until every file's
/// tasks have settled, and finishes each ingestion. Returns the task
/// operations created and the files whose tasks failed for good.
async fn drive<S: Store>(
    engine: &Engine<S>,
    context: &CommandContext,
    reading: &FileReading,
    claims: Vec<IngestionClaim>,
    mut settled: usize,
    progress: &dyn IngestProgress,
    known_paths: &KnownPaths,
) -> Result<(usize, usize), IngestError> {
    let settler = &reading.settler;
    let mut created_tasks = 0;
    let mut failed = 0;
    let mut in_flight: Vec<InFlight> = Vec::new();
    let mut waiting: Vec<InFlight> = Vec::new();

    // Files settled at a glance go first, a chunk at a time; files still
    // being written are watched until they settle, after the others.
    let mut slow = Vec::new();
    let mut ready = Vec::new();
    for claim in claims {
        let path = PathBuf::from(&claim.path);
        let file = InFlight {
            claim,
            path,
            media_id: None,
            tasks: Vec::new(),
        };
        if file.claim.stage.rank() >= IngestionStage::Registered.rank() {
            // Resumed after registration: only its tasks are left.
            waiting.push(file);
            continue;
        }
        match settler.check(&file.path).await {
            Ok(Some(_)) => ready.push(file),
            _ => slow.push(file),
        }
    }
    for chunk in growing_chunks(ready, FIRST_CHUNK, CHUNK) {
        let (registered, created, unreadable) = register(engine, context, known_paths, chunk, reading, false).await?;
        created_tasks += created;
        settled += unreadable;
        failed += unreadable;
        in_flight.extend(registered);
        let (done, fails) = finish_settled(engine, context, &mut in_flight).await?;
        settled += done;
        failed += fails;
        progress.settled(settled, failed);
    }
    tracing::info!(
        in_flight = in_flight.len(),
        slow = slow.len(),
        "files settled at a glance registered"
    );
    if !slow.is_empty() {
        let (registered, created, unreadable) = register(engine, context, known_paths, slow, reading, true).await?;
        created_tasks += created;
        settled += unreadable;
        failed += unreadable;
        in_flight.extend(registered);
    }
    // Resumed files registered by a run that died: find their tasks.
    if !waiting.is_empty() {
        let (registered, created, unreadable) = register(engine, context, known_paths, waiting, reading, false).await?;
        created_tasks += created;
        settled += unreadable;
        failed += unreadable;
        in_flight.extend(registered);
    }
    while !in_flight.is_empty() {
        let (done, fails) = finish_settled(engine, context, &mut in_flight).await?;
        settled += done;
        failed += fails;
        progress.settled(settled, failed);
        if !in_flight.is_empty() {
            // The last files are polled more often: the run ends when they
            // settle, and nothing else is left to do meanwhile.
            let poll = if in_flight.len() <= SETTLE_WINDOW { 20 } else { 100 };
            tokio::time::sleep(Duration::from_millis(poll)).await;
        }
    }
    Ok((created_tasks, failed))
}

/// Chunks of `first` items, then twice as many each time up to `size`.
fn growing_chunks<T>(items: Vec<T>, first: usize, size: usize) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    let mut next = first.clamp(1, size.max(1));
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        out.push(items.by_ref().take(next).collect());
        next = (next * 2).min(size.max(1));
    }
    out
}

fn chunks<T>(items: Vec<T>, size: usize) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        out.push(items.by_ref().take(size).collect());
    }
    out
}

/// Hashing, parsing and registration of a group of files: stage `hashing`
/// in one transaction, the reads on the compute threads (all queued at
/// once, so the threads go from one file to the next without waiting;
/// files still being written are first waited for when `watch`), then
/// `parsing`, `registered`, the media items and their task requests in
/// another. Files that cannot be read end their ingestion
/// `failed_terminal` with the reason.
async fn register<S: Store>(
    engine: &Engine<S>,
    context: &CommandContext,
    known_paths: &KnownPaths,
    files: Vec<InFlight>,
    reading: &FileReading,
    watch: bool,
) -> Result<(Vec<InFlight>, usize, usize), IngestError> {
    if files.is_empty() {
        return Ok((Vec::new(), 0, 0));
    }
    let claims: Vec<IngestionClaim> = files.iter().map(|file| file.claim.clone()).collect();
    if watch {
        // The stage a file waits in while it is still being written.
        engine
            .ingestion_stage(context, &claims, IngestionStage::Settling)
            .await?;
    }
    let queued = files.len();
    let read: Vec<(InFlight, Result<FileRead, String>)> = futures::stream::iter(files)
        .map(|file| {
            let settler = reading.settler.clone();
            let compute = reading.compute.clone();
            async move {
                let path = file.path.clone();
                let result = async {
                    if watch {
                        settler
                            .settle(&path)
                            .await
                            .map_err(|error| format!("{} did not settle: {error}", path.display()))?;
                    }
                    compute
                        .run(move || read_file(&path))
                        .await
                        .map_err(|error| format!("reading did not finish: {error}"))?
                }
                .await;
                (file, result)
            }
        })
        .buffer_unordered(queued)
        .collect()
        .await;
    engine
        .ingestion_stage(context, &claims, IngestionStage::Hashing)
        .await?;
    let mut registrations = Vec::new();
    let mut unreadable = Vec::new();
    let mut by_operation: BTreeMap<OperationId, InFlight> = BTreeMap::new();
    for (file, result) in read {
        match result {
            Ok((digest, byte_size, media_kind, parsed)) => {
                registrations.push(Registration {
                    claim: file.claim.clone(),
                    content_digest: digest,
                    byte_size,
                    media_kind,
                    parsed,
                });
                by_operation.insert(file.claim.operation_id, file);
            }
            Err(reason) => unreadable.push((file.claim.clone(), Err(reason))),
        }
    }
    let unreadable_count = unreadable.len();
    if !unreadable.is_empty() {
        engine.finish_ingestions(context, unreadable).await?;
    }
    let mut created = 0;
    let mut registered = Vec::new();
    for chunk in chunks(registrations, CHUNK) {
        for outcome in engine.register_ingestions(context, chunk, INGEST_TASK_KINDS).await? {
            created += outcome.tasks_created;
            if let Some(mut file) = by_operation.remove(&outcome.operation_id) {
                file.media_id = Some(outcome.media_id);
                if let Ok(mut paths) = known_paths.write() {
                    paths.insert(outcome.media_id, PathBuf::from(&file.claim.path));
                }
                file.tasks = outcome.task_operations;
                registered.push(file);
            }
        }
    }
    Ok((registered, created, unreadable_count))
}

/// What reading a file found: its digest, size, media kind and parse.
type FileRead = (String, i64, String, Value);

/// Reads a file once: its content digest and size, and what its header
/// says it is.
fn read_file(path: &Path) -> Result<FileRead, String> {
    let hash = hash_file(path).map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    let (media_kind, parsed) = match read_metadata(path) {
        Ok(metadata) => (
            "image".to_string(),
            json!({"format": metadata.format, "width": metadata.width, "height": metadata.height}),
        ),
        Err(error) => ("unknown".to_string(), json!({"error": error.to_string()})),
    };
    Ok((
        hash.digest(),
        i64::try_from(hash.byte_size).unwrap_or(i64::MAX),
        media_kind,
        parsed,
    ))
}

/// Finishes every file whose tasks have all settled. Returns how many
/// finished and how many of them had a task fail for good.
async fn finish_settled<S: Store>(
    engine: &Engine<S>,
    context: &CommandContext,
    in_flight: &mut Vec<InFlight>,
) -> Result<(usize, usize), IngestError> {
    if in_flight.is_empty() {
        return Ok((0, 0));
    }
    // Tasks are claimed about in registration order, so files settle about
    // in that order too: read the states of the oldest files a window at a
    // time, and stop at the first window where most are still running,
    // instead of reading every file's states on every poll.
    let mut states: BTreeMap<OperationId, ProcessingStateRow> = BTreeMap::new();
    let mut looked_at = 0;
    while looked_at < in_flight.len() {
        let window = &in_flight[looked_at..(looked_at + SETTLE_WINDOW).min(in_flight.len())];
        looked_at += window.len();
        let tasks: Vec<OperationId> = window.iter().flat_map(|file| file.tasks.iter().copied()).collect();
        let read = engine.media_task_states(&tasks).await?;
        let settled = read.iter().filter(|state| state.status.is_terminal()).count();
        states.extend(read.into_iter().map(|state| (state.operation_id, state)));
        if settled * 2 < tasks.len() {
            break;
        }
    }
    let mut finished = Vec::new();
    let mut failed = 0;
    let mut still = in_flight.split_off(looked_at);
    let looked: Vec<InFlight> = std::mem::take(in_flight);
    let mut still_running = Vec::new();
    for file in looked {
        let file_states: Vec<&ProcessingStateRow> = file.tasks.iter().filter_map(|id| states.get(id)).collect();
        let all_settled =
            file_states.len() == file.tasks.len() && file_states.iter().all(|state| state.status.is_terminal());
        if !all_settled {
            still_running.push(file);
            continue;
        }
        let failures: Vec<String> = file_states
            .iter()
            .filter(|state| {
                matches!(
                    state.status,
                    OperationStatus::FailedTerminal | OperationStatus::DeadLettered | OperationStatus::MissingConfirmed
                )
            })
            .map(|state| {
                format!(
                    "{}: {}",
                    state.task_kind,
                    state
                        .last_error
                        .as_deref()
                        .or(state.status_reason.as_deref())
                        .unwrap_or("failed")
                )
            })
            .collect();
        if !failures.is_empty() {
            failed += 1;
        }
        let tasks: serde_json::Map<String, Value> = file_states
            .iter()
            .map(|state| (state.task_kind.clone(), json!(state.status.as_str())))
            .collect();
        let output = json!({
            "media_id": file.media_id,
            "tasks": tasks,
            "failures": failures,
        });
        finished.push((file.claim.clone(), Ok(output)));
    }
    // Those still running go back in front of the ones not looked at.
    let mut waiting = std::mem::take(&mut still_running);
    waiting.append(&mut still);
    *in_flight = waiting;
    let done = finished.len();
    for chunk in chunks(finished, CHUNK) {
        engine.finish_ingestions(context, chunk).await?;
    }
    Ok((done, failed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_chunks_start_small_and_double_up_to_the_chunk_size() {
        let sizes: Vec<usize> = growing_chunks((0..1000).collect::<Vec<_>>(), 32, 250)
            .iter()
            .map(Vec::len)
            .collect();
        assert_eq!(sizes, vec![32, 64, 128, 250, 250, 250, 26]);
        let flattened: Vec<i32> = growing_chunks((0..1000).collect::<Vec<_>>(), 32, 250)
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(flattened, (0..1000).collect::<Vec<_>>(), "every file once, in order");
        assert!(growing_chunks(Vec::<i32>::new(), 32, 250).is_empty());
    }
}
