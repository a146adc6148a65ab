//! Benchmark workloads (SPEC §8): realistic event streams to append and
//! replay. The timing and the raw floor live with the caller (`opledger
//! bench`), which knows the backend; this module only builds the work, so
//! every backend is measured on identical events.

use opledger_domain::events::{
    Event, MediaRegistered, OperationClaimed, OperationCreated, OperationFailed, OperationProgressed, OperationStarted,
    OperationSucceeded, OperationTarget,
};
use opledger_domain::{MediaId, NewEvent, OperationId, OperationStatus, StreamId, Timestamp};
use opledger_store::{ExpectedVersion, StreamAppend};
use serde_json::json;
use uuid::Uuid;

/// Operations per media item in the generated workload.
const OPERATIONS_PER_MEDIA: u64 = 4;
/// Events of one operation's life: created, claimed, started, progress, succeeded.
pub const EVENTS_PER_OPERATION: u64 = 5;

/// A deterministic stream of realistic events: media registrations, each
/// followed by a few export operations living their whole lifecycle.
/// Ids are derived from a counter, so two runs produce identical logs.
pub struct LifecycleWorkload {
    next_item: u64,
    start: Timestamp,
    /// Whether operations are the media tasks that keep capability states
    /// (metadata, thumbnail, perceptual_hash beside an export), with one in
    /// [`FAILING_ONE_IN`] failing terminally into the review queue.
    media_tasks: bool,
}

/// Task kinds of a media item's operations in the media-task workload.
const MEDIA_TASK_KINDS: [&str; OPERATIONS_PER_MEDIA as usize] = ["metadata", "thumbnail", "perceptual_hash", "export"];
/// In the media-task workload, one operation in this many (a thumbnail:
/// item 2 of every 50, never a media registration) fails terminally.
pub const FAILING_ONE_IN: u64 = 50;

/// One unit of the workload: the events of one stream, in order.
pub struct StreamEvents {
    pub stream_id: StreamId,
    pub events: Vec<NewEvent>,
}

impl LifecycleWorkload {
    /// Export operations only: the workload `append` and `replay` measure.
    pub fn new(start: Timestamp) -> Self {
        LifecycleWorkload {
            next_item: 0,
            start,
            media_tasks: false,
        }
    }

    /// Media tasks with capability states and some terminal failures (so
    /// review entries): the library a dashboard summarises (`status`,
    /// `timeline`). Same number of events per operation as [`Self::new`].
    pub fn with_media_tasks(start: Timestamp) -> Self {
        LifecycleWorkload {
            next_item: 0,
            start,
            media_tasks: true,
        }
    }

    fn stamp(&self, offset_ms: u64, event: Event, actor: &str, correlation: &str) -> NewEvent {
        NewEvent {
            event,
            recorded_at: self.start.plus_millis(offset_ms as i64),
            actor: actor.to_string(),
            correlation_id: correlation.to_string(),
            causation_id: Some(format!("bench-command-{offset_ms}")),
        }
    }

    /// The next stream's events: a media registration or an operation's life.
    pub fn next_stream(&mut self) -> StreamEvents {
        let item = self.next_item;
        self.next_item += 1;
        let media_index = item / (OPERATIONS_PER_MEDIA + 1);
        let media_id = MediaId(Uuid::from_u128(
            0x6d65_6469_6100_0000_0000_0000_0000_0000 | u128::from(media_index),
        ));
        let correlation = format!("bench-batch-{media_index}");
        if item.is_multiple_of(OPERATIONS_PER_MEDIA + 1) {
            let event = Event::MediaRegistered(MediaRegistered {
                media_id,
                path: format!("/library/photos/{media_index:08}.jpg"),
                media_kind: "image".into(),
                content_digest: Some(format!("sha256:{:064x}", u128::from(media_index) * 7919)),
                byte_size: Some(250_000 + (media_index as i64 % 1000)),
            });
            return StreamEvents {
                stream_id: StreamId::media(media_id),
                events: vec![self.stamp(item, event, "ingest", &correlation)],
            };
        }
        let operation_id = OperationId(Uuid::from_u128(
            0x6f70_0000_0000_0000_0000_0000_0000_0000 | u128::from(item),
        ));
        let revision = format!("{:064x}", u128::from(item) * 104_729);
        let claim_token = Uuid::from_u128(0x746f_6b00_0000_0000_0000_0000_0000_0000 | u128::from(item)).to_string();
        let worker = format!("bench-worker-{}", item % 16);
        let (kind, task_version) = if self.media_tasks {
            let kind = MEDIA_TASK_KINDS[(item % (OPERATIONS_PER_MEDIA + 1)) as usize - 1];
            (kind, Some("1".to_string()))
        } else {
            ("export", None)
        };
        let outcome = if self.media_tasks && item % FAILING_ONE_IN == 2 {
            Event::OperationFailed(OperationFailed {
                operation_id,
                claim_token: Some(claim_token.clone()),
                error: "decoding failed: truncated file".into(),
                retryable: false,
            })
        } else {
            Event::OperationSucceeded(OperationSucceeded {
                operation_id,
                claim_token: Some(claim_token.clone()),
                output: json!({"thumbnail": format!("thumbnails/{item:08}.webp"), "width": 256, "height": 171}),
            })
        };
        let events = vec![
            Event::OperationCreated(OperationCreated {
                operation_id,
                kind: kind.into(),
                target: OperationTarget {
                    media_id: Some(media_id),
                    region_id: None,
                    path: None,
                },
                revision: Some(revision.clone()),
                inputs: json!({"longest_side": 256, "format": "webp"}),
                status: OperationStatus::Queued,
                priority: 0,
                task_version,
            }),
            Event::OperationClaimed(OperationClaimed {
                operation_id,
                claim_token: claim_token.clone(),
                worker: worker.clone(),
                revision: Some(revision),
                lease_expires_at: self.start.plus_millis(item as i64 + 30_000),
            }),
            Event::OperationStarted(OperationStarted {
                operation_id,
                claim_token: claim_token.clone(),
            }),
            Event::OperationProgressed(OperationProgressed {
                operation_id,
                phase: "writing".into(),
                processed: 1,
                total: Some(1),
            }),
            outcome,
        ];
        let actors = ["scheduler", &worker, &worker, &worker, &worker];
        StreamEvents {
            stream_id: StreamId::operation(operation_id),
            events: events
                .into_iter()
                .zip(actors)
                .enumerate()
                .map(|(step, (event, actor))| self.stamp(item * 10 + step as u64, event, actor, &correlation))
                .collect(),
        }
    }

    /// At least `events` events, as whole streams, each stream appended as
    /// one `StreamAppend` expecting a new stream.
    pub fn appends(&mut self, events: u64) -> Vec<StreamAppend> {
        let mut appends = Vec::new();
        let mut produced = 0u64;
        while produced < events {
            let stream = self.next_stream();
            produced += stream.events.len() as u64;
            appends.push(StreamAppend {
                stream_id: stream.stream_id,
                expected: ExpectedVersion::NoStream,
                events: stream.events,
            });
        }
        appends
    }

    /// Groups whole streams into transactions of about `batch` events.
    pub fn batches(appends: Vec<StreamAppend>, batch: usize) -> Vec<Vec<StreamAppend>> {
        let mut batches = Vec::new();
        let mut current = Vec::new();
        let mut size = 0;
        for append in appends {
            size += append.events.len();
            current.push(append);
            if size >= batch {
                batches.push(std::mem::take(&mut current));
                size = 0;
            }
        }
        if !current.is_empty() {
            batches.push(current);
        }
        batches
    }

    /// Splits streams into one event per transaction, each expecting the
    /// stream version the previous one left.
    pub fn one_event_each(appends: Vec<StreamAppend>) -> Vec<StreamAppend> {
        let mut singles = Vec::new();
        for append in appends {
            for (index, event) in append.events.into_iter().enumerate() {
                singles.push(StreamAppend {
                    stream_id: append.stream_id.clone(),
                    expected: ExpectedVersion::Exactly(index as i64),
                    events: vec![event],
                });
            }
        }
        singles
    }
}

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
        if self.claim_latencies_us.is_empty() {
            return 0;
        }
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

fn quantile(sorted: &[u64], fraction: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let index = ((sorted.len() - 1) as f64 * fraction).round() as usize;
    sorted[index]
}

/// Registers `media` items (half the tasks: each gets `metadata` and
/// `thumbnail`), outside the measured part.
pub async fn register_lifecycle_media<S: opledger_store::Store>(
    engine: &crate::Engine<S>,
    media: u64,
) -> Result<Vec<MediaId>, crate::EngineError> {
    use futures::StreamExt;
    let context = crate::CommandContext::actor("bench");
    let registered: Vec<Result<MediaId, crate::EngineError>> = futures::stream::iter(0..media)
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

/// The task lifecycle (SPEC §8 `lifecycle`): every task is requested,
/// claimed in batches by `workers` concurrent workers and completed, all
/// through the public commands with every projection updated inline. The
/// requester runs alongside the workers, as in a live pipeline.
pub async fn run_task_lifecycle<S: opledger_store::Store>(
    engine: &crate::Engine<S>,
    media: &[MediaId],
    workers: usize,
    claim_batch: usize,
) -> Result<TaskLifecycleRun, crate::EngineError> {
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
            let context = crate::CommandContext::actor("bench-requester");
            let requests = media.into_iter().flat_map(|media_id| {
                [
                    crate::TaskRequest {
                        target: crate::TaskTarget::Media(media_id),
                        kind: "metadata".to_string(),
                        inputs: json!({}),
                        priority: 0,
                    },
                    crate::TaskRequest {
                        target: crate::TaskTarget::Media(media_id),
                        kind: "thumbnail".to_string(),
                        inputs: json!({"max_side": 256, "format": "webp"}),
                        priority: 0,
                    },
                ]
            });
            // Requests go in batches, as a scheduler enqueues a folder.
            let batches: Vec<Vec<crate::TaskRequest>> = requests
                .collect::<Vec<_>>()
                .chunks(REQUEST_BATCH)
                .map(<[crate::TaskRequest]>::to_vec)
                .collect();
            let results: Vec<Result<Vec<Result<crate::RequestOutcome, crate::EngineError>>, crate::EngineError>> =
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
            Ok::<_, crate::EngineError>(())
        })
    };

    let mut handles = Vec::new();
    for worker in 0..workers {
        let (engine, completed) = (engine.clone(), completed.clone());
        handles.push(tokio::spawn(async move {
            let name = format!("bench-worker-{worker}");
            let context = crate::CommandContext::actor(name.clone());
            let mut latencies = Vec::new();
            while completed.load(Ordering::SeqCst) < tasks {
                let done_before = completed.load(Ordering::SeqCst);
                let asked = std::time::Instant::now();
                let claims = engine
                    .claim_tasks(
                        &context,
                        crate::ClaimRequest {
                            kinds: Vec::new(),
                            worker: name.clone(),
                            lease_ms: 60_000,
                            limit: claim_batch,
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
                            crate::Completion::Output(json!({"bytes": 1024, "attempt": claim.attempt})),
                        )
                    })
                    .collect();
                for outcome in engine.complete_tasks(&context, completions).await? {
                    outcome?;
                    completed.fetch_add(1, Ordering::SeqCst);
                }
            }
            Ok::<_, crate::EngineError>(latencies)
        }));
    }
    requester
        .await
        .map_err(|error| opledger_store::StoreError::unavailable(format!("requester task: {error}")))??;
    let mut claims_by_history = Vec::new();
    for handle in handles {
        let latencies = handle
            .await
            .map_err(|error| opledger_store::StoreError::unavailable(format!("worker task: {error}")))??;
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
