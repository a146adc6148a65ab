//! The image workers of a run: a worker pool running the image tasks on
//! compute threads, in the background from the moment the ingestions have
//! started until every file has settled.

use crate::{IngestError, IngestOptions};
use opledger_domain::MediaId;
use opledger_engine::Engine;
use opledger_media::{
    resolver_fn, AudioMetadataTask, DecodeCache, ExecutionCounter, MetadataTask, PerceptualHashTask, PosterFrameTask,
    ThumbnailTask, VideoMetadataTask,
};
use opledger_store::Store;
use opledger_worker::{ComputeThreads, FlightRecord, PoolError, PoolReport, TaskError, WorkerPool};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// Claims the pool holds per image worker: enough that the compute threads
/// always find work queued while other tasks' claims and outcomes commit.
const CLAIMS_PER_WORKER: usize = 32;
const MAX_SLOTS: usize = 128;

/// Where each media item registered by this run is on disk.
pub(crate) type KnownPaths = Arc<RwLock<BTreeMap<MediaId, PathBuf>>>;

/// A running pool of image workers.
pub(crate) struct ImageWorkers {
    /// The threads that do the image work; the run's file reading shares them.
    pub compute: ComputeThreads,
    /// Paths of the files this run registered, as registration recorded
    /// them: a task finds its file without a read of the registry. Media
    /// this run did not register (a resumed run's) are looked up.
    pub known_paths: KnownPaths,
    /// Turns true when the pool has ended on its own (it gave up on
    /// storage trouble): the run stops and answers with its error.
    pub ended: watch::Receiver<bool>,
    executions: ExecutionCounter,
    stop: oneshot::Sender<()>,
    running: JoinHandle<Result<PoolReport, PoolError>>,
}

/// What the pool did, once stopped.
pub(crate) struct WorkersStopped {
    /// What the pool reported, unless it was dropped before its end.
    pub report: Option<PoolReport>,
    /// Image task executions.
    pub tasks_run: u64,
}

impl ImageWorkers {
    /// Starts the pool as `worker`.
    pub(crate) fn start<S: Store>(
        engine: &Engine<S>,
        worker: &str,
        options: &IngestOptions,
    ) -> Result<ImageWorkers, IngestError> {
        let executions: ExecutionCounter = Arc::new(AtomicU64::new(0));
        let known_paths: KnownPaths = Arc::new(RwLock::new(BTreeMap::new()));
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
                    .map(|media| opledger_media::text_path(&media.path))
                    .map_err(|error| TaskError::retryable(format!("finding media {media_id}: {error}")))
            }
        });
        // `workers` threads do the image work (the CPU's share), taking the
        // tasks' closures in turn; the pool holds several times as many
        // claims, so a task's two durable commits (claim, completion)
        // overlap other tasks' work and group-commit with theirs instead of
        // leaving the CPU idle while the disk syncs.
        // What the threads run is recorded, so the run after a crash knows
        // which claims were running and which only waited.
        let record_path = crate::lock::flight_record_path(&options.thumbnails_dir, worker);
        let record = FlightRecord::create(&record_path)
            .map_err(|error| IngestError::Io(format!("creating {}: {error}", record_path.display())))?;
        let compute = ComputeThreads::recording(options.workers, "opledger-image", Some(Arc::new(record)))
            .map_err(|error| IngestError::Io(format!("starting the image threads: {error}")))?;
        let slots = (options.workers.max(1) * CLAIMS_PER_WORKER).min(MAX_SLOTS);
        // The three tasks of a file decode it once between them; the cache
        // holds the working images of the files whose tasks the pool may
        // hold claims on at once.
        let decodes = Arc::new(DecodeCache::new(slots.max(DecodeCache::DEFAULT_ENTRIES)));
        let pool = WorkerPool::builder(engine.clone(), worker.to_string())
            .task(
                MetadataTask::new(resolver.clone())
                    .with_counter(executions.clone())
                    .with_cache(decodes.clone())
                    .on_compute_threads(compute.clone()),
            )
            .task(
                ThumbnailTask::new(resolver.clone(), options.thumbnails_dir.clone())
                    .with_counter(executions.clone())
                    .with_cache(decodes.clone())
                    .on_compute_threads(compute.clone()),
            )
            .task(
                PerceptualHashTask::new(resolver.clone())
                    .with_counter(executions.clone())
                    .with_cache(decodes.clone())
                    .on_compute_threads(compute.clone()),
            )
            // A video's and a sound's kinds: the video tools run as child
            // processes, not on the compute threads.
            .task(VideoMetadataTask::new(resolver.clone(), options.ffmpeg.clone()).with_counter(executions.clone()))
            .task(
                PosterFrameTask::new(resolver.clone(), options.ffmpeg.clone(), options.thumbnails_dir.clone())
                    .with_counter(executions.clone()),
            )
            .task(AudioMetadataTask::new(resolver).with_counter(executions.clone()))
            .workers(slots)
            .lease(options.lease)
            .heartbeat_interval(options.lease / 4)
            .recovery_interval(Duration::from_secs(1))
            .idle_poll(Duration::from_millis(50))
            .give_up_after(options.give_up_after)
            .build()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let (end, ended) = watch::channel(false);
        let running = tokio::spawn(async move {
            let report = pool
                .run_until(async move {
                    let _ = stopped.await;
                })
                .await;
            let _ = end.send(true);
            report
        });
        Ok(ImageWorkers {
            compute,
            known_paths,
            ended,
            executions,
            stop,
            running,
        })
    }

    /// Stops the pool and waits until it has finished.
    pub(crate) async fn stop(self) -> Result<WorkersStopped, IngestError> {
        let _ = self.stop.send(());
        let report = self
            .running
            .await
            .map_err(|error| IngestError::Io(format!("the worker pool panicked: {error}")))??;
        Ok(WorkersStopped {
            report: Some(report),
            tasks_run: self.executions.load(Ordering::SeqCst),
        })
    }

    /// Stops claiming and lets running tasks finish, until `grace` has
    /// passed or `now` resolves; then the tasks still running are dropped
    /// (their claims stay held: the caller releases them). The answer's
    /// `report` is `None` when tasks were dropped.
    pub(crate) async fn stop_within(
        self,
        grace: Duration,
        now: impl std::future::Future<Output = ()>,
    ) -> Result<WorkersStopped, IngestError> {
        let _ = self.stop.send(());
        let mut running = self.running;
        let report = tokio::select! {
            finished = &mut running => Some(
                finished.map_err(|error| IngestError::Io(format!("the worker pool panicked: {error}")))??,
            ),
            () = tokio::time::sleep(grace) => None,
            () = now => None,
        };
        if report.is_none() {
            // Dropping the pool drops its jobs; outcomes already handed to
            // its reporter are still written.
            running.abort();
            let _ = running.await;
        }
        Ok(WorkersStopped {
            report,
            tasks_run: self.executions.load(Ordering::SeqCst),
        })
    }
}
