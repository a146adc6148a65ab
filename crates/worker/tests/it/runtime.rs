//! The worker runtime on real SQLite files and real tokio tasks: draining a
//! queue exactly once with concurrent workers, cancellation reaching a
//! running task (and `cancelled` recorded only after its cleanup), file
//! outputs fenced against a lost claim, retries and panics, and throttled
//! progress on the timeline.

use opledger_domain::events::Event;
use opledger_domain::kinds::legacy;
use opledger_domain::{MediaId, OperationId, OperationStatus, Timestamp};
use opledger_engine::{Clock, CommandContext, Engine, FixedClock, FixedJitter, TaskRequest, TaskTarget, UuidV7Ids};
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use opledger_worker::{Job, JobError, Outcome, PoolError, PoolReport, StopReason, Task, TaskError, WorkerPool};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

const START: i64 = 1_700_000_000_000_000;

async fn open_store(folder: &Path) -> SqliteStore {
    SqliteStore::open(SqliteConfig::at(folder.join("ledger.db")))
        .await
        .unwrap()
}

/// An engine on the system clock.
async fn engine_at(folder: &Path) -> Engine<SqliteStore> {
    let engine = Engine::new(open_store(folder).await);
    engine.startup().await.unwrap();
    engine
        .declare(&CommandContext::actor("test"), legacy::declarations())
        .await
        .unwrap();
    engine
}

/// An engine on a clock the test moves, with no retry jitter.
async fn engine_with_clock(folder: &Path) -> (Engine<SqliteStore>, Arc<FixedClock>) {
    let clock = Arc::new(FixedClock::at(Timestamp::from_micros(START)));
    let engine = Engine::with_clock(open_store(folder).await, clock.clone(), Arc::new(UuidV7Ids))
        .with_jitter(Arc::new(FixedJitter(0)));
    engine.startup().await.unwrap();
    engine
        .declare(&CommandContext::actor("test"), legacy::declarations())
        .await
        .unwrap();
    (engine, clock)
}

fn context() -> CommandContext {
    CommandContext::actor("test")
}

async fn register(engine: &Engine<SqliteStore>, index: usize) -> MediaId {
    engine
        .register_media(
            &context(),
            &format!("/photos/{index:04}.png"),
            "image",
            Some(format!("sha256:{index:064x}")),
            Some(1_000 + index as i64),
        )
        .await
        .unwrap()
}

async fn request(engine: &Engine<SqliteStore>, media: MediaId, kind: &str) -> OperationId {
    let inputs = match kind {
        "thumbnail" => json!({"max_side": 256, "format": "png"}),
        "perceptual_hash" => json!({"algorithm": "dhash"}),
        _ => json!({}),
    };
    engine
        .request_task(
            &context(),
            TaskRequest {
                target: TaskTarget::Media(media),
                kind: kind.into(),
                inputs,
                priority: 0,
            },
        )
        .await
        .unwrap()
        .operation_id
}

async fn status_of(engine: &Engine<SqliteStore>, operation: OperationId) -> OperationStatus {
    engine.task_by_operation(operation).await.unwrap().unwrap().state.status
}

async fn assert_replay_agrees(engine: &Engine<SqliteStore>) {
    let verify = engine.verify().await.unwrap();
    assert!(verify.is_identical(), "{}", verify.render());
}

/// Files in `folder` whose names end in `.tmp`.
fn temporary_files(folder: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(folder)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "tmp"))
        .collect()
}

/// Counts runs per (operation, revision); `thumbnail` also writes its file
/// through the job's fenced output path.
struct Counting {
    kind: &'static str,
    outputs: PathBuf,
    runs: Arc<Mutex<BTreeMap<(OperationId, String), u32>>>,
}

impl Task for Counting {
    fn kind(&self) -> &'static str {
        self.kind
    }

    async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
        *self
            .runs
            .lock()
            .unwrap()
            .entry((job.operation_id(), job.revision().to_string()))
            .or_default() += 1;
        job.progress("working", 0, Some(1)).await?;
        tokio::task::yield_now().await;
        if self.kind == "thumbnail" {
            let final_path = self.outputs.join(format!("{}.png", job.operation_id()));
            let temporary = job.output_path_for(&final_path)?;
            std::fs::write(&temporary, job.revision())?;
            job.commit_output(&temporary, &final_path).await?;
            return Ok(Outcome::output(json!({"path": final_path})));
        }
        Ok(Outcome::output(
            json!({"format": "png", "digest": job.inputs()["content_digest"]}),
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pool_of_four_workers_drains_every_task_exactly_once() {
    let folder = tempfile::tempdir().unwrap();
    let outputs = folder.path().join("thumbnails");
    std::fs::create_dir(&outputs).unwrap();
    let engine = engine_at(folder.path()).await;
    let mut operations = Vec::new();
    for index in 0..200 {
        let media = register(&engine, index).await;
        for kind in ["metadata", "thumbnail"] {
            operations.push((media, kind, request(&engine, media, kind).await));
        }
    }
    let runs = Arc::new(Mutex::new(BTreeMap::new()));
    let pool = WorkerPool::builder(engine.clone(), "drain")
        .task(Counting {
            kind: "metadata",
            outputs: outputs.clone(),
            runs: runs.clone(),
        })
        .task(Counting {
            kind: "thumbnail",
            outputs: outputs.clone(),
            runs: runs.clone(),
        })
        .workers(4)
        .batch(8)
        .lease(Duration::from_secs(30))
        .idle_poll(Duration::from_millis(20))
        .build()
        .unwrap();

    let report = pool.run_until_idle().await.unwrap();

    assert_eq!(report.claimed, 400);
    assert_eq!(report.executed, 400);
    assert_eq!(report.completed, 400);
    assert_eq!(
        (report.failed, report.cancelled, report.lost, report.unreported),
        (0, 0, 0, 0)
    );
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 400, "every (operation, revision) ran");
    assert!(
        runs.values().all(|count| *count == 1),
        "each ran exactly once: {runs:?}"
    );
    for (media, kind, operation) in &operations {
        let view = engine
            .task_state(TaskTarget::Media(*media), kind)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(view.state.operation_id, *operation);
        assert_eq!(view.state.status, OperationStatus::Succeeded, "{kind} on {media}");
        assert_eq!(view.state.attempt_count, 1);
        assert_eq!(
            view.state.completed_revision.as_deref(),
            Some(view.state.requested_revision.as_str())
        );
        assert!(view.lease.is_none(), "no claim is left behind");
        if *kind == "thumbnail" {
            let written = std::fs::read_to_string(outputs.join(format!("{operation}.png"))).unwrap();
            assert_eq!(written, view.state.requested_revision);
        }
    }
    assert!(temporary_files(&outputs).is_empty());
    assert_replay_agrees(&engine).await;
}

/// Runs one worker of `task` with a short heartbeat (so a cancel request
/// reaches the task quickly) until the returned sender is used.
fn one_watchful_worker<T: Task>(
    engine: &Engine<SqliteStore>,
    name: &str,
    task: T,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<PoolReport, PoolError>>,
) {
    let pool = WorkerPool::builder(engine.clone(), name)
        .task(task)
        .workers(1)
        .lease(Duration::from_secs(5))
        .heartbeat_interval(Duration::from_millis(30))
        .idle_poll(Duration::from_millis(20))
        .build()
        .unwrap();
    let (shutdown, shutdown_rx) = oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        pool.run_until(async {
            let _ = shutdown_rx.await;
        })
        .await
    });
    (shutdown, running)
}

/// Hands its job's stop signal to a plain thread, as blocking image work
/// would, and reports what that thread saw: running, then stopped.
struct WatchesFromAThread {
    seen: mpsc::UnboundedSender<&'static str>,
}

impl Task for WatchesFromAThread {
    fn kind(&self) -> &'static str {
        "thumbnail"
    }

    async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
        let signal = job.stop_signal();
        let seen = self.seen.clone();
        let watcher = std::thread::spawn(move || {
            if signal.checkpoint().is_ok() {
                seen.send("running").unwrap();
            }
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::time::Instant::now() < deadline {
                if let Err(stopped) = signal.checkpoint() {
                    seen.send(if matches!(stopped, opledger_worker::JobError::Cancelled) {
                        "cancelled"
                    } else {
                        "stopped otherwise"
                    })
                    .unwrap();
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            seen.send("never stopped").unwrap();
        });
        let reason = job.cancelled().await;
        let _ = tokio::task::spawn_blocking(move || watcher.join()).await;
        Err(TaskError::Stopped(reason))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stop_signal_tells_work_on_another_thread_that_its_job_was_cancelled() {
    let folder = tempfile::tempdir().unwrap();
    let engine = engine_at(folder.path()).await;
    let media = register(&engine, 1).await;
    let operation = request(&engine, media, "thumbnail").await;
    let (seen, mut seen_rx) = mpsc::unbounded_channel();
    let (shutdown, running) = one_watchful_worker(&engine, "signal", WatchesFromAThread { seen });
    async fn next(rx: &mut mpsc::UnboundedReceiver<&'static str>) -> &'static str {
        tokio::time::timeout(Duration::from_secs(15), rx.recv())
            .await
            .unwrap()
            .unwrap()
    }
    assert_eq!(next(&mut seen_rx).await, "running");
    engine
        .cancel_task(&context(), operation, "the user removed the photo")
        .await
        .unwrap();
    assert_eq!(next(&mut seen_rx).await, "cancelled");
    shutdown.send(()).unwrap();
    let report = running.await.unwrap().unwrap();
    assert_eq!((report.executed, report.cancelled), (1, 1));
    assert_eq!(status_of(&engine, operation).await, OperationStatus::Cancelled);
}

/// Writes a temporary output, tells the test where, and waits to be told
/// to stop. It leaves the file for the runtime to remove.
struct WaitsForCancel {
    outputs: PathBuf,
    written: mpsc::UnboundedSender<PathBuf>,
}

impl Task for WaitsForCancel {
    fn kind(&self) -> &'static str {
        "thumbnail"
    }

    async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
        let final_path = self.outputs.join("cancelled.png");
        let temporary = job.output_path_for(&final_path)?;
        std::fs::write(&temporary, b"half a thumbnail")?;
        self.written.send(temporary).unwrap();
        let reason = job.cancelled().await;
        Err(TaskError::Stopped(reason))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancellation_reaches_a_running_task_and_cancelled_is_recorded_after_cleanup() {
    let folder = tempfile::tempdir().unwrap();
    let engine = engine_at(folder.path()).await;
    let media = register(&engine, 1).await;
    let operation = request(&engine, media, "thumbnail").await;
    let (written, mut written_rx) = mpsc::unbounded_channel();
    let (shutdown, running) = one_watchful_worker(
        &engine,
        "cancel",
        WaitsForCancel {
            outputs: folder.path().to_path_buf(),
            written,
        },
    );

    let temporary = tokio::time::timeout(Duration::from_secs(10), written_rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(temporary.exists());
    let name = temporary.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with(".cancelled.png.") && name.ends_with(".tmp"), "{name}");
    let asked = engine
        .cancel_task(&context(), operation, "the user removed the photo")
        .await
        .unwrap();
    assert!(asked.cancel_requested);
    assert_ne!(
        asked.status,
        OperationStatus::Cancelled,
        "a claimed task is cancelled by its worker"
    );

    // Each poll reads the status first and the file second: since the
    // worker removes the file before it records `cancelled`, no poll may
    // see `cancelled` with the file still there.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = status_of(&engine, operation).await;
        let exists = temporary.exists();
        if status == OperationStatus::Cancelled {
            assert!(
                !exists,
                "cancelled was recorded while the temporary output still existed"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never cancelled (status {status})"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(!temporary.exists());
    assert!(!folder.path().join("cancelled.png").exists(), "nothing was committed");

    shutdown.send(()).unwrap();
    let report = running.await.unwrap().unwrap();
    assert_eq!((report.executed, report.cancelled, report.failed), (1, 1, 0));
    let view = engine.task_by_operation(operation).await.unwrap().unwrap();
    assert!(view.lease.is_none());
    let types: Vec<&str> = engine
        .timeline(operation)
        .await
        .unwrap()
        .iter()
        .map(|event| event.event_type())
        .collect();
    let requested = types
        .iter()
        .position(|kind| *kind == "operation_cancel_requested")
        .unwrap();
    let cancelled = types.iter().position(|kind| *kind == "operation_cancelled").unwrap();
    assert!(requested < cancelled, "{types:?}");
    let timeline = engine.timeline(operation).await.unwrap();
    assert_eq!(timeline[cancelled].actor, "cancel/slot-0");
    assert_replay_agrees(&engine).await;
}

/// Waits at a gate, then fails with a retryable error.
struct FailsAfterGate {
    started: mpsc::UnboundedSender<()>,
    resume: tokio::sync::Mutex<Option<oneshot::Receiver<()>>>,
}

impl Task for FailsAfterGate {
    fn kind(&self) -> &'static str {
        "metadata"
    }

    async fn run(&self, _job: &mut Job) -> Result<Outcome, TaskError> {
        self.started.send(()).unwrap();
        let resume = self.resume.lock().await.take().unwrap();
        resume.await.unwrap();
        Err(TaskError::retryable("the extractor timed out"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failure_reported_after_an_unseen_cancel_request_ends_cancelled_not_stuck() {
    let folder = tempfile::tempdir().unwrap();
    let engine = engine_at(folder.path()).await;
    let media = register(&engine, 2).await;
    let operation = request(&engine, media, "metadata").await;
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let (resume, resume_rx) = oneshot::channel();
    let pool = WorkerPool::builder(engine.clone(), "unseen")
        .task(FailsAfterGate {
            started,
            resume: tokio::sync::Mutex::new(Some(resume_rx)),
        })
        .workers(1)
        .heartbeat_interval(Duration::from_secs(3_600))
        .idle_poll(Duration::from_millis(20))
        .build()
        .unwrap();
    let running = tokio::spawn({
        let pool = pool.clone();
        async move { pool.run_until_idle().await }
    });
    tokio::time::timeout(Duration::from_secs(10), started_rx.recv())
        .await
        .unwrap()
        .unwrap();
    let asked = engine
        .cancel_task(&context(), operation, "not needed any more")
        .await
        .unwrap();
    assert!(asked.cancel_requested);
    resume.send(()).unwrap();
    let report = running.await.unwrap().unwrap();
    assert_eq!((report.executed, report.cancelled), (1, 1));

    // The failure is recorded, but no retry that no claim would take: the
    // cancel is finished, and the queue still claims normally.
    assert_eq!(status_of(&engine, operation).await, OperationStatus::Cancelled);
    let types: Vec<&str> = engine
        .timeline(operation)
        .await
        .unwrap()
        .iter()
        .map(|event| event.event_type())
        .collect();
    assert!(
        types.ends_with(&["operation_failed", "operation_cancelled"]),
        "{types:?}"
    );
    let again = pool.run_until_idle().await.unwrap();
    assert_eq!(again.executed, 0);
    assert_replay_agrees(&engine).await;
}

/// Holds one permit of a one-permit semaphore while it computes, hands it
/// to the job, and records whether the permit was free again right after
/// its output was committed.
struct Sharing {
    permits: Arc<tokio::sync::Semaphore>,
    outputs: PathBuf,
    free_after_commit: Arc<Mutex<Vec<usize>>>,
    engine: Engine<SqliteStore>,
    clock: Arc<FixedClock>,
    /// The lease row's last heartbeat after the commit, against the claim's.
    beats_after_commit: Arc<Mutex<Vec<(Timestamp, Timestamp)>>>,
}

impl Task for Sharing {
    fn kind(&self) -> &'static str {
        "thumbnail"
    }

    async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
        let permit = self.permits.clone().acquire_owned().await.unwrap();
        job.hold_compute_share(permit);
        assert_eq!(self.permits.available_permits(), 0);
        let final_path = self.outputs.join(format!("{}.png", job.operation_id()));
        let temporary = job.output_path_for(&final_path)?;
        std::fs::write(&temporary, job.revision())?;
        // A second of the 60 s lease gone: a heartbeat would stamp it.
        self.clock.advance_millis(1_000);
        job.commit_output(&temporary, &final_path).await?;
        let lease = self
            .engine
            .task_by_operation(job.operation_id())
            .await
            .unwrap()
            .unwrap()
            .lease
            .unwrap();
        self.beats_after_commit
            .lock()
            .unwrap()
            .push((lease.heartbeat_at, job.claim().lease_expires_at.plus_millis(-60_000)));
        self.free_after_commit
            .lock()
            .unwrap()
            .push(self.permits.available_permits());
        Ok(Outcome::output(json!({"path": final_path})))
    }
}

/// A task's CPU share goes back when it starts committing its output (the
/// flush, fence check and rename wait on the disk), and the output commit
/// of a claim with most of its lease left checks the fence by a read: no
/// lease extension is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committing_an_output_gives_back_the_compute_share_and_reads_the_fence() {
    let folder = tempfile::tempdir().unwrap();
    let outputs = folder.path().join("thumbnails");
    std::fs::create_dir(&outputs).unwrap();
    let (engine, clock) = engine_with_clock(folder.path()).await;
    let beats_after_commit = Arc::new(Mutex::new(Vec::new()));
    let mut operations = Vec::new();
    for index in 0..6 {
        let media = register(&engine, index).await;
        operations.push(request(&engine, media, "thumbnail").await);
    }
    let free_after_commit = Arc::new(Mutex::new(Vec::new()));
    let pool = WorkerPool::builder(engine.clone(), "sharing")
        .task(Sharing {
            permits: Arc::new(tokio::sync::Semaphore::new(1)),
            outputs: outputs.clone(),
            free_after_commit: free_after_commit.clone(),
            engine: engine.clone(),
            clock: clock.clone(),
            beats_after_commit: beats_after_commit.clone(),
        })
        .workers(1)
        .lease(Duration::from_secs(60))
        .heartbeat_interval(Duration::from_secs(50))
        .idle_poll(Duration::from_millis(20))
        .build()
        .unwrap();
    let report = pool.run_until_idle().await.unwrap();
    assert_eq!(report.completed, 6);
    assert_eq!(*free_after_commit.lock().unwrap(), vec![1; 6]);
    for (heartbeat_at, claimed_at) in beats_after_commit.lock().unwrap().iter() {
        assert_eq!(heartbeat_at, claimed_at, "the fence was read, not beaten");
    }
    assert_eq!(beats_after_commit.lock().unwrap().len(), 6);
    for operation in operations {
        assert_eq!(status_of(&engine, operation).await, OperationStatus::Succeeded);
        let view = engine.task_by_operation(operation).await.unwrap().unwrap();
        assert!(view.lease.is_none(), "the lease row went with the completion");
        assert!(outputs.join(format!("{operation}.png")).exists());
    }
    assert!(temporary_files(&outputs).is_empty());
    assert_replay_agrees(&engine).await;
}

/// Writes `content` to a temporary output and commits it to
/// `{outputs}/{operation}.png`. With a gate, it waits between writing and
/// committing, and hands the commit's result to the test.
struct Writer {
    content: &'static str,
    outputs: PathBuf,
    gate: Option<Gate>,
}

struct Gate {
    written: mpsc::UnboundedSender<PathBuf>,
    resume: tokio::sync::Mutex<Option<oneshot::Receiver<()>>>,
    committed: mpsc::UnboundedSender<Result<(), String>>,
}

impl Task for Writer {
    fn kind(&self) -> &'static str {
        "thumbnail"
    }

    async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
        let final_path = self.outputs.join(format!("{}.png", job.operation_id()));
        let temporary = job.output_path_for(&final_path)?;
        std::fs::write(&temporary, self.content)?;
        let Some(gate) = &self.gate else {
            job.commit_output(&temporary, &final_path).await?;
            return Ok(Outcome::output(json!({"path": final_path})));
        };
        gate.written.send(temporary.clone()).unwrap();
        let resume = gate.resume.lock().await.take().unwrap();
        resume.await.unwrap();
        let committed = job.commit_output(&temporary, &final_path).await;
        gate.committed
            .send(match &committed {
                Ok(()) => Ok(()),
                Err(error) if error.is_claim_lost() => Err(format!("claim lost: {error}")),
                Err(error) => Err(format!("other: {error}")),
            })
            .unwrap();
        committed?;
        Ok(Outcome::output(json!({"path": final_path})))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_claim_never_renames_its_output_into_place() {
    let folder = tempfile::tempdir().unwrap();
    let outputs = folder.path().join("thumbnails");
    std::fs::create_dir(&outputs).unwrap();
    let (engine, clock) = engine_with_clock(folder.path()).await;
    let media = register(&engine, 7).await;
    let operation = request(&engine, media, "thumbnail").await;

    // Worker A: a short lease and no heartbeat to speak of, so its claim
    // expires while its task is paused between writing and committing.
    let (written, mut written_rx) = mpsc::unbounded_channel();
    let (resume, resume_rx) = oneshot::channel();
    let (committed, mut committed_rx) = mpsc::unbounded_channel();
    let pool_a = WorkerPool::builder(engine.clone(), "worker-a")
        .task(Writer {
            content: "A",
            outputs: outputs.clone(),
            gate: Some(Gate {
                written,
                resume: tokio::sync::Mutex::new(Some(resume_rx)),
                committed,
            }),
        })
        .workers(1)
        .lease(Duration::from_secs(1))
        .heartbeat_interval(Duration::from_secs(3_600))
        .recovery_interval(Duration::from_secs(3_600))
        .idle_poll(Duration::from_millis(20))
        .build()
        .unwrap();
    let (shutdown_a, shutdown_a_rx) = oneshot::channel::<()>();
    let running_a = tokio::spawn(async move {
        pool_a
            .run_until(async {
                let _ = shutdown_a_rx.await;
            })
            .await
    });
    let temporary_a = tokio::time::timeout(Duration::from_secs(10), written_rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(std::fs::read_to_string(&temporary_a).unwrap(), "A");

    // A's lease runs out; recovery interrupts the claim and requeues it.
    clock.advance_millis(5_000);
    let recovered = engine.recover(&context()).await.unwrap();
    assert_eq!((recovered.interrupted, recovered.requeued), (1, 1));

    // Worker B takes the task and commits its file.
    let pool_b = WorkerPool::builder(engine.clone(), "worker-b")
        .task(Writer {
            content: "B",
            outputs: outputs.clone(),
            gate: None,
        })
        .workers(1)
        .idle_poll(Duration::from_millis(20))
        .build()
        .unwrap();
    let report_b = pool_b.run_until_idle().await.unwrap();
    assert_eq!(report_b.completed, 1);
    let final_path = outputs.join(format!("{operation}.png"));
    assert_eq!(std::fs::read_to_string(&final_path).unwrap(), "B");

    // A wakes up and tries to commit: refused, its file removed, B's kept.
    resume.send(()).unwrap();
    let commit_a = tokio::time::timeout(Duration::from_secs(10), committed_rx.recv())
        .await
        .unwrap()
        .unwrap();
    let refusal = commit_a.expect_err("a lost claim must not commit");
    assert!(refusal.starts_with("claim lost"), "{refusal}");
    assert_eq!(std::fs::read_to_string(&final_path).unwrap(), "B");
    assert!(!temporary_a.exists());
    shutdown_a.send(()).unwrap();
    let report_a = running_a.await.unwrap().unwrap();
    assert_eq!((report_a.executed, report_a.lost), (1, 1));
    assert_eq!((report_a.completed, report_a.failed, report_a.unreported), (0, 0, 0));
    assert!(temporary_files(&outputs).is_empty());

    let view = engine.task_by_operation(operation).await.unwrap().unwrap();
    assert_eq!(view.state.status, OperationStatus::Succeeded);
    assert_eq!(view.state.attempt_count, 2);
    assert_eq!(view.state.interruption_count, 1);
    let timeline = engine.timeline(operation).await.unwrap();
    let succeeded: Vec<_> = timeline
        .iter()
        .filter(|event| event.event_type() == "operation_succeeded")
        .collect();
    assert_eq!(succeeded.len(), 1);
    assert_eq!(succeeded[0].actor, "worker-b/slot-0");
    assert_replay_agrees(&engine).await;
}

/// Fails the first attempt of each operation, succeeds after.
struct FailsOnce {
    seen: Mutex<BTreeMap<OperationId, u32>>,
}

impl Task for FailsOnce {
    fn kind(&self) -> &'static str {
        "metadata"
    }

    async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
        let runs = {
            let mut seen = self.seen.lock().unwrap();
            let runs = seen.entry(job.operation_id()).or_default();
            *runs += 1;
            *runs
        };
        if runs == 1 {
            return Err(TaskError::retryable("the file was still being copied"));
        }
        Ok(Outcome::output(json!({"attempt": job.attempt()})))
    }
}

struct Panics;

impl Task for Panics {
    fn kind(&self) -> &'static str {
        "thumbnail"
    }

    async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
        tokio::task::yield_now().await;
        panic!("decoder exploded on attempt {}", job.attempt());
    }
}

struct Corrupt;

impl Task for Corrupt {
    fn kind(&self) -> &'static str {
        "perceptual_hash"
    }

    async fn run(&self, _job: &mut Job) -> Result<Outcome, TaskError> {
        Err(TaskError::terminal("not an image: bad PNG signature"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retryable_error_is_retried_with_backoff_and_a_panic_is_a_failure() {
    let folder = tempfile::tempdir().unwrap();
    let (engine, clock) = engine_with_clock(folder.path()).await;
    let media = register(&engine, 3).await;
    for kind in ["metadata", "thumbnail", "perceptual_hash"] {
        request(&engine, media, kind).await;
    }
    let pool = WorkerPool::builder(engine.clone(), "retry")
        .task(FailsOnce {
            seen: Mutex::new(BTreeMap::new()),
        })
        .task(Panics)
        .task(Corrupt)
        .workers(3)
        .idle_poll(Duration::from_millis(20))
        .build()
        .unwrap();
    let state = |kind: &'static str| {
        let engine = engine.clone();
        async move {
            engine
                .task_state(TaskTarget::Media(media), kind)
                .await
                .unwrap()
                .unwrap()
                .state
        }
    };

    let first = pool.run_until_idle().await.unwrap();
    assert_eq!(
        (first.executed, first.failed, first.panicked, first.failed_terminal),
        (3, 3, 1, 1)
    );
    let now = clock.now();
    let flaky = state("metadata").await;
    assert_eq!(flaky.status, OperationStatus::RetryWaiting);
    assert_eq!((flaky.attempt_count, flaky.failure_count), (1, 1));
    assert_eq!(flaky.last_error.as_deref(), Some("the file was still being copied"));
    assert_eq!(flaky.available_at, now.plus_millis(1_000), "first backoff, no jitter");
    let panicked = state("thumbnail").await;
    assert_eq!(panicked.status, OperationStatus::RetryWaiting);
    assert_eq!((panicked.attempt_count, panicked.failure_count), (1, 1));
    let error = panicked.last_error.clone().unwrap();
    assert!(
        error.contains("panicked") && error.contains("decoder exploded on attempt 1"),
        "{error}"
    );
    let corrupt = state("perceptual_hash").await;
    assert_eq!(corrupt.status, OperationStatus::FailedTerminal);
    assert_eq!((corrupt.attempt_count, corrupt.failure_count), (1, 1));
    assert_eq!(corrupt.last_error.as_deref(), Some("not an image: bad PNG signature"));

    // Nothing is due before the backoff has passed.
    let early = pool.run_until_idle().await.unwrap();
    assert_eq!(early.executed, 0);

    clock.advance_millis(1_000);
    let second = pool.run_until_idle().await.unwrap();
    assert_eq!(
        (second.executed, second.completed, second.failed, second.panicked),
        (2, 1, 1, 1)
    );
    let flaky = state("metadata").await;
    assert_eq!(flaky.status, OperationStatus::Succeeded);
    assert_eq!((flaky.attempt_count, flaky.failure_count), (2, 1));
    assert_eq!(
        flaky
            .output
            .as_deref()
            .map(serde_json::from_str::<serde_json::Value>)
            .unwrap()
            .unwrap(),
        json!({"attempt": 2})
    );
    let panicked = state("thumbnail").await;
    assert_eq!(panicked.status, OperationStatus::RetryWaiting);
    assert_eq!((panicked.attempt_count, panicked.failure_count), (2, 2));
    assert!(panicked.last_error.unwrap().contains("decoder exploded on attempt 2"));
    assert_eq!(
        panicked.available_at,
        clock.now().plus_millis(2_000),
        "the backoff doubles"
    );
    assert_replay_agrees(&engine).await;
}

/// Fails without saying why.
struct Silent;

impl Task for Silent {
    fn kind(&self) -> &'static str {
        "metadata"
    }

    async fn run(&self, _job: &mut Job) -> Result<Outcome, TaskError> {
        Err(TaskError::terminal("  "))
    }
}

/// The engine refuses a failure without a reason, but a task that gives
/// none must not leave its work claimed: the pool records a fixed reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_failing_without_a_message_is_recorded_with_a_fixed_reason() {
    let folder = tempfile::tempdir().unwrap();
    let engine = engine_at(folder.path()).await;
    let media = register(&engine, 1).await;
    request(&engine, media, "metadata").await;
    let pool = WorkerPool::builder(engine.clone(), "silent")
        .task(Silent)
        .workers(1)
        .idle_poll(Duration::from_millis(20))
        .build()
        .unwrap();
    let report = pool.run_until_idle().await.unwrap();
    assert_eq!((report.executed, report.failed_terminal), (1, 1));
    let state = engine
        .task_state(TaskTarget::Media(media), "metadata")
        .await
        .unwrap()
        .unwrap()
        .state;
    assert_eq!(state.status, OperationStatus::FailedTerminal);
    assert_eq!(state.last_error.as_deref(), Some("the task failed without a message"));
    assert_replay_agrees(&engine).await;
}

/// Reports progress 1000 times in a tight loop across two phases, pausing
/// once mid-phase so the test can read the live counters.
struct Chatty {
    paused: mpsc::UnboundedSender<()>,
    resume: tokio::sync::Mutex<Option<oneshot::Receiver<()>>>,
}

impl Task for Chatty {
    fn kind(&self) -> &'static str {
        "metadata"
    }

    async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
        for processed in 1..=500 {
            job.progress("aggregating", processed, Some(500)).await?;
        }
        for processed in 1..=300 {
            job.progress("writing", processed, Some(500)).await?;
        }
        // Past the throttle interval, the next report goes out at once.
        tokio::time::sleep(Duration::from_millis(300)).await;
        job.progress("writing", 301, Some(500)).await?;
        self.paused.send(()).unwrap();
        let resume = self.resume.lock().await.take().unwrap();
        resume.await.unwrap();
        for processed in 302..=500 {
            job.progress("writing", processed, Some(500)).await?;
        }
        job.checkpoint()?;
        Ok(Outcome::output(json!({"rows": 500})))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn progress_is_throttled_and_phase_changes_are_on_the_timeline() {
    let folder = tempfile::tempdir().unwrap();
    let engine = engine_at(folder.path()).await;
    let media = register(&engine, 5).await;
    let operation = request(&engine, media, "metadata").await;
    let (paused, mut paused_rx) = mpsc::unbounded_channel();
    let (resume, resume_rx) = oneshot::channel();
    let pool = WorkerPool::builder(engine.clone(), "progress")
        .task(Chatty {
            paused,
            resume: tokio::sync::Mutex::new(Some(resume_rx)),
        })
        .workers(1)
        .idle_poll(Duration::from_millis(20))
        .build()
        .unwrap();
    let running = tokio::spawn(async move { pool.run_until_idle().await });

    tokio::time::timeout(Duration::from_secs(10), paused_rx.recv())
        .await
        .unwrap()
        .unwrap();
    // Counters within a phase are live (another connection sees them)
    // without being events.
    let lease = engine
        .task_by_operation(operation)
        .await
        .unwrap()
        .unwrap()
        .lease
        .unwrap();
    assert_eq!(lease.phase.as_deref(), Some("writing"));
    assert_eq!((lease.processed, lease.total), (Some(301), Some(500)));
    resume.send(()).unwrap();
    let report = running.await.unwrap().unwrap();
    assert_eq!(report.completed, 1);
    assert!(
        report.progress_reports <= 10,
        "1000 progress calls became {} reports",
        report.progress_reports
    );

    let timeline = engine.timeline(operation).await.unwrap();
    let progressed: Vec<(String, i64, Option<i64>)> = timeline
        .iter()
        .filter_map(|envelope| match &envelope.event {
            Event::OperationProgressed(progress) => Some((progress.phase.clone(), progress.processed, progress.total)),
            _ => None,
        })
        .collect();
    assert_eq!(
        progressed,
        vec![
            ("aggregating".to_string(), 1, Some(500)),
            ("writing".to_string(), 1, Some(500)),
            ("writing".to_string(), 500, Some(500)),
        ],
        "phase changes and the final count, nothing in between"
    );
    let last_progress = timeline
        .iter()
        .rposition(|event| event.event_type() == "operation_progressed")
        .unwrap();
    let succeeded = timeline
        .iter()
        .position(|event| event.event_type() == "operation_succeeded")
        .unwrap();
    assert!(last_progress < succeeded);
    assert_eq!(status_of(&engine, operation).await, OperationStatus::Succeeded);
    assert_replay_agrees(&engine).await;
}

/// `JobError` and `StopReason` are what a task matches on; keep them usable.
#[test]
fn a_stop_reason_converts_to_the_matching_job_error() {
    assert!(matches!(
        JobError::from(StopReason::CancelRequested),
        JobError::Cancelled
    ));
    let lost = JobError::from(StopReason::ClaimLost("recovered".into()));
    assert!(lost.is_claim_lost());
    assert_eq!(lost.stop_reason(), Some(StopReason::ClaimLost("recovered".into())));
    assert_eq!(
        TaskError::from(JobError::Invalid("no file name".into())),
        TaskError::terminal("no file name")
    );
}

/// The crate documentation's example, run: a task kind of a few lines in a
/// pool of four workers drains what was requested.
mod documentation_example {
    use opledger_worker::{Job, Outcome, Task, TaskError, WorkerPool};
    use serde_json::json;

    struct Metadata;

    impl Task for Metadata {
        fn kind(&self) -> &'static str {
            "metadata"
        }

        async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
            job.progress("reading", 0, Some(1)).await?;
            Ok(Outcome::output(json!({"digest": job.inputs()["content_digest"]})))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_crate_documentation_example_drains_what_was_requested() {
        let folder = tempfile::tempdir().unwrap();
        let engine = super::engine_at(folder.path()).await;
        for index in 0..3 {
            let media = super::register(&engine, index).await;
            super::request(&engine, media, "metadata").await;
        }
        let pool = WorkerPool::builder(engine, "ingest")
            .task(Metadata)
            .workers(4)
            .build()
            .unwrap();
        let report = pool.run_until_idle().await.unwrap();
        assert_eq!((report.completed, report.failed), (3, 0));
    }
}
