//! `lifecycle`: tasks through request → claim → complete by concurrent
//! workers, every projection updated inline, all through the engine's
//! public commands; and the run's claim latency as finished history grows.

use crate::backend::BenchBackend;
use crate::floor::logged_floor_rows;
use crate::stats::{per_second, quantile, round3};
use crate::{BenchError, Options};
use opledger_domain::MediaId;
use opledger_engine::{
    ClaimRequest, CommandContext, Completion, Engine, EngineError, RequestOutcome, TaskRequest, TaskTarget,
};
use opledger_store::Store;
use serde_json::{json, Value};

/// Requests per `request_tasks` call in the lifecycle workload.
const REQUEST_BATCH: usize = 64;

/// What one run of the task lifecycle workload measured.
#[derive(Debug, Clone)]
pub struct TaskLifecycleRun {
    pub tasks: u64,
    pub workers: usize,
    pub claim_batch: usize,
    /// From the first request to the last completion.
    pub elapsed: std::time::Duration,
    /// Events the run appended (requests, claims, completions).
    pub events: u64,
    /// Every claim call's latency, sorted, in microseconds.
    pub claim_latencies_us: Vec<u64>,
    /// Every claim call as (tasks completed when it was asked, latency in
    /// µs), in order of the first: how claim cost moves as finished
    /// history grows.
    pub claims_by_history: Vec<(u64, u64)>,
}

/// Claim latency over one slice of a run's finished history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistorySlice {
    /// Tasks completed when the first claim of the slice was asked.
    pub completed_from: u64,
    /// Tasks completed when the slice ends.
    pub completed_to: u64,
    pub claims: usize,
    pub p50_us: u64,
    pub p99_us: u64,
}

impl TaskLifecycleRun {
    /// The `fraction` quantile (0.5 = median) of claim latency, in µs.
    pub fn claim_latency_us(&self, fraction: f64) -> u64 {
        quantile(&self.claim_latencies_us, fraction)
    }

    /// Claim latency in `slices` equal slices of the finished history (by
    /// tasks completed when each claim was asked), so a claim cost that
    /// grows with history shows as rising slices.
    pub fn claim_latency_by_history(&self, slices: u64) -> Vec<HistorySlice> {
        let slices = slices.max(1);
        let width = self.tasks.div_ceil(slices).max(1);
        let mut found = Vec::new();
        for slice in 0..slices {
            let (from, to) = (slice * width, ((slice + 1) * width).min(self.tasks));
            let mut latencies: Vec<u64> = self
                .claims_by_history
                .iter()
                .filter(|(completed, _)| *completed >= from && (*completed < to || (slice + 1 == slices)))
                .map(|(_, latency)| *latency)
                .collect();
            if latencies.is_empty() {
                continue;
            }
            latencies.sort_unstable();
            found.push(HistorySlice {
                completed_from: from,
                completed_to: to,
                claims: latencies.len(),
                p50_us: quantile(&latencies, 0.5),
                p99_us: quantile(&latencies, 0.99),
            });
        }
        found
    }
}

/// The task kinds the lifecycle runs on every item.
const LIFECYCLE_KINDS: [&str; 2] = ["metadata", "thumbnail"];

/// Registers `media` items (half the tasks: each gets `metadata` and
/// `thumbnail`), outside the measured part.
pub async fn register_lifecycle_media<S: Store>(engine: &Engine<S>, media: u64) -> Result<Vec<MediaId>, EngineError> {
    use futures::StreamExt;
    let context = CommandContext::actor("bench");
    // The kinds the lifecycle runs (appends nothing once declared).
    let kinds = opledger_domain::kinds::legacy::declarations()
        .into_iter()
        .filter(|kind| LIFECYCLE_KINDS.contains(&kind.name.as_str()))
        .collect();
    engine.declare(&context, kinds).await?;
    let registered: Vec<Result<MediaId, EngineError>> = futures::stream::iter(0..media)
        .map(|item| {
            let (engine, context) = (engine.clone(), context.clone());
            async move {
                engine
                    .register_media(
                        &context,
                        &format!("/bench/{item:08}.jpg"),
                        "image",
                        Some(format!("sha256:{item:064x}")),
                        Some(100_000 + item as i64),
                    )
                    .await
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    registered.into_iter().collect()
}

/// The task lifecycle: every task is requested,
/// claimed in batches by `workers` concurrent workers and completed, all
/// through the public commands with every projection updated inline. The
/// requester runs alongside the workers, as in a live pipeline.
pub async fn run_task_lifecycle<S: Store>(
    engine: &Engine<S>,
    media: &[MediaId],
    workers: usize,
    claim_batch: usize,
) -> Result<TaskLifecycleRun, BenchError> {
    use futures::StreamExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let tasks = media.len() as u64 * 2;
    let head_before = engine.store().head().await?;
    let completed = Arc::new(AtomicU64::new(0));
    let started = std::time::Instant::now();

    let requester = {
        let (engine, media) = (engine.clone(), media.to_vec());
        tokio::spawn(async move {
            let context = CommandContext::actor("bench-requester");
            let requests = media.into_iter().flat_map(|media_id| {
                [
                    TaskRequest {
                        target: TaskTarget::Media(media_id),
                        kind: "metadata".to_string(),
                        inputs: json!({}),
                        priority: 0,
                    },
                    TaskRequest {
                        target: TaskTarget::Media(media_id),
                        kind: "thumbnail".to_string(),
                        inputs: json!({"max_side": 256, "format": "webp"}),
                        priority: 0,
                    },
                ]
            });
            // Requests go in batches, as a scheduler enqueues a folder.
            let batches: Vec<Vec<TaskRequest>> = requests
                .collect::<Vec<_>>()
                .chunks(REQUEST_BATCH)
                .map(<[TaskRequest]>::to_vec)
                .collect();
            let results: Vec<Result<Vec<Result<RequestOutcome, EngineError>>, EngineError>> =
                futures::stream::iter(batches)
                    .map(|batch| {
                        let (engine, context) = (engine.clone(), context.clone());
                        async move { engine.request_tasks(&context, batch).await }
                    })
                    .buffer_unordered(4)
                    .collect()
                    .await;
            for result in results {
                for outcome in result? {
                    outcome?;
                }
            }
            Ok::<_, EngineError>(())
        })
    };

    let mut handles = Vec::new();
    for worker in 0..workers {
        let (engine, completed) = (engine.clone(), completed.clone());
        handles.push(tokio::spawn(async move {
            let name = format!("bench-worker-{worker}");
            let context = CommandContext::actor(name.clone());
            let mut latencies = Vec::new();
            while completed.load(Ordering::SeqCst) < tasks {
                let done_before = completed.load(Ordering::SeqCst);
                let asked = std::time::Instant::now();
                let claims = engine
                    .claim_tasks(
                        &context,
                        ClaimRequest {
                            kinds: Vec::new(),
                            worker: name.clone(),
                            lease_ms: 60_000,
                            limit: claim_batch,
                            principal: None,
                            versions: Default::default(),
                        },
                    )
                    .await?;
                latencies.push((done_before, asked.elapsed().as_micros() as u64));
                if claims.is_empty() {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    continue;
                }
                // The worker reports its batch's outcomes together, each
                // fenced and answered on its own.
                let completions = claims
                    .iter()
                    .map(|claim| {
                        (
                            claim.fence(),
                            Completion::Output(json!({"bytes": 1024, "attempt": claim.attempt})),
                        )
                    })
                    .collect();
                for outcome in engine.complete_tasks(&context, completions).await? {
                    outcome?;
                    completed.fetch_add(1, Ordering::SeqCst);
                }
            }
            Ok::<_, EngineError>(latencies)
        }));
    }
    requester.await.map_err(BenchError::task("requester task"))??;
    let mut claims_by_history = Vec::new();
    for handle in handles {
        let latencies = handle.await.map_err(BenchError::task("worker task"))??;
        claims_by_history.extend(latencies);
    }
    let elapsed = started.elapsed();
    claims_by_history.sort_unstable();
    let mut claim_latencies_us: Vec<u64> = claims_by_history.iter().map(|(_, latency)| *latency).collect();
    claim_latencies_us.sort_unstable();
    let events = (engine.store().head().await? - head_before) as u64;
    Ok(TaskLifecycleRun {
        tasks,
        workers,
        claim_batch,
        elapsed,
        events,
        claim_latencies_us,
        claims_by_history,
    })
}

/// Reads `tasks`, `workers` and `claim_batch`: one run per worker count on
/// a fresh database each. The floor: the same number of events, read back
/// from our log, as plain INSERTs in transactions of 100 (the append
/// floor's shape).
pub(crate) async fn lifecycle<B: BenchBackend>(backend: &B, options: &Options) -> Result<Value, BenchError> {
    let media_count = (options.tasks / 2).max(1);
    let mut runs = Vec::new();
    for &workers in &options.workers {
        let store = backend.fresh_store(&format!("lifecycle_{workers}")).await?;
        let (engine, _) = Engine::open(store).await?;
        let media = register_lifecycle_media(&engine, media_count).await?;
        let head_before = engine.store().head().await?;
        let run = run_task_lifecycle(&engine, &media, workers.max(1), options.claim_batch).await?;
        // The floor inserts the very events this run appended.
        let rows = logged_floor_rows(engine.store(), head_before).await?;
        drop(engine);
        let floor_store = backend.fresh_store("lifecycle_floor").await?;
        let floor_elapsed = backend.plain_inserts(&floor_store, &rows, 100).await?;
        drop(floor_store);
        let tasks_per_sec = per_second(run.tasks, run.elapsed);
        let events_per_sec = per_second(run.events, run.elapsed);
        let floor_events_per_sec = per_second(rows.len() as u64, floor_elapsed);
        runs.push(json!({
            "workers": workers,
            "tasks": run.tasks,
            "claim_batch": run.claim_batch,
            "seconds": run.elapsed.as_secs_f64(),
            "tasks_per_sec": tasks_per_sec.round(),
            "events": run.events,
            "events_per_sec": events_per_sec.round(),
            "floor_events_per_sec": floor_events_per_sec.round(),
            "ratio_to_floor": round3(events_per_sec / floor_events_per_sec),
            "claim_latency_p50_us": run.claim_latency_us(0.5),
            "claim_latency_p99_us": run.claim_latency_us(0.99),
            "claim_latency_by_history": run.claim_latency_by_history(5).iter().map(|slice| json!({
                "completed_from": slice.completed_from,
                "completed_to": slice.completed_to,
                "claims": slice.claims,
                "p50_us": slice.p50_us,
                "p99_us": slice.p99_us,
            })).collect::<Vec<_>>(),
        }));
    }
    let (durability, setting) = backend.durability();
    Ok(json!({
        "workload": "lifecycle",
        "backend": backend.name(),
        (durability): setting,
        "runs": runs,
        "workload_tasks": "media items each with a metadata and a thumbnail task: request (revision computed), batch claim, complete; the requester runs alongside the workers; every projection (operations, processing states) updated inline, every step an event on the task's timeline",
        "floor": format!("the events the run appended, read back and inserted in transactions of 100: {}", backend.floor_description()),
    }))
}
