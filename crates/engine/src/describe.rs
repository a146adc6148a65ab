//! Explaining and following one operation: `describe` gathers what the
//! projections say about it (its row, its processing state with the claim's
//! liveness, its kind's retry policy, its capability, its place in the
//! claim queue) and its timeline, and asks `opledger_explain` why it
//! stands where it stands; `follow` reads its stream on from the last
//! version seen, and `watch_status` re-reads the dashboard summary
//! when the log moved.
//!
//! Reads only, from read connections: nothing here appends, so a reader
//! (the CLI, an HTTP service) can serve them from a read-only ledger. The
//! place in the queue is one bounded, indexed count through the store
//! ([`Store::claimable_ahead`]), never a scan of the queue.

use crate::error::EngineError;
use crate::queries::StatusReport;
use crate::work::TaskView;
use crate::Engine;
use futures::stream::{self, BoxStream, StreamExt};
use opledger_domain::projections::{
    capability_key, task_kind_key, CapabilityRow, OperationRow, Row, CAPABILITY_STATES_TABLE, TASK_KINDS_TABLE,
};
use opledger_domain::tasks::{RetryPolicy, CLAIMABLE_STATUSES};
use opledger_domain::{EventEnvelope, OperationId, OperationStatus, StreamId, Timestamp};
use opledger_explain::{why, Facts, ProgressNote, QueuePosition, Why};
use opledger_store::{AheadQuery, Store};
use std::time::Duration;

/// The most claimable tasks ahead that `describe` counts: past it, the
/// sentence says "at least". Bounds the read whatever the queue's length.
pub const QUEUE_COUNT_LIMIT: usize = 10_000;

/// Events a follow reads per poll at most (the rest come at the next one,
/// without waiting).
const FOLLOW_PAGE: usize = 1_000;

/// Everything `describe` shows about one operation.
#[derive(Debug, Clone)]
pub struct Description {
    pub operation: OperationRow,
    /// Where the operation's file is: its own path (a file ingestion), or
    /// its media item's (none once the item is removed).
    pub path: Option<String>,
    /// The task's processing state and claim liveness (none for a file
    /// ingestion, which is not a task).
    pub task: Option<TaskView>,
    /// The retry policy its declared kind has now.
    pub policy: Option<RetryPolicy>,
    /// The capability the task produces on its item, if any.
    pub capability: Option<CapabilityRow>,
    /// For claimable work: how many claimable tasks of its kind come first.
    pub queue: Option<QueuePosition>,
    pub why: Why,
    /// The operation's events in stream order.
    pub timeline: Vec<EventEnvelope>,
    /// The engine clock's time the description was made at (what the
    /// sentence's "in 12 s" counts from).
    pub described_at: Timestamp,
}

impl Description {
    /// The lease as heartbeats extended it, while a claim is held.
    pub fn lease_ends(&self) -> Option<Timestamp> {
        match &self.task {
            Some(task) => task.lease_expires_at(),
            None => self.operation.lease_expires_at,
        }
    }

    /// The stream version the timeline ends at (where a follow goes on).
    pub fn version(&self) -> i64 {
        self.timeline.last().map_or(0, |event| event.stream_version)
    }
}

/// When the operation entered its current status: the last status change
/// on its timeline (its creation when nothing changed it since).
fn status_since(timeline: &[EventEnvelope], fallback: Timestamp) -> Timestamp {
    timeline
        .iter()
        .rev()
        .find(|event| event.event.cause().is_some() || event.stream_version == 1)
        .map_or(fallback, |event| event.recorded_at)
}

impl<S: Store> Engine<S> {
    /// One operation explained: its projected state, why it stands there
    /// (one [`Why`], which the domain renders as a sentence) and its
    /// timeline. NotFound for an unknown operation.
    pub async fn describe(&self, operation_id: OperationId) -> Result<Description, EngineError> {
        let now = self.clock.now();
        let operation = self.operation(operation_id).await?;
        let timeline = self.store.read_stream(&StreamId::operation(operation_id)).await?;
        let task = self.task_by_operation(operation_id).await?;
        let policy = match &task {
            Some(task) => self.declared_policy(&task.state.task_kind).await?,
            None => None,
        };
        let capability = match operation.media_id {
            Some(_) => self.capability_of(operation_id).await?,
            None => None,
        };
        let path = match (&operation.path, operation.media_id) {
            (Some(path), _) => Some(path.clone()),
            (None, Some(media_id)) => match self.media(media_id).await {
                Ok(media) => Some(media.path),
                Err(EngineError::Domain(opledger_domain::DomainError::NotFound { .. })) => None,
                Err(error) => return Err(error),
            },
            (None, None) => None,
        };
        let queue = match &task {
            Some(task) if is_waiting_for_a_claim(task, now) => Some(self.queue_position(task, now).await?),
            _ => None,
        };
        let progress = progress_of(&operation, task.as_ref());
        let lease_ends = task.as_ref().and_then(TaskView::lease_expires_at);
        let why = why(&Facts {
            operation: &operation,
            state: task.as_ref().map(|task| &task.state),
            lease_ends,
            progress: progress.as_ref(),
            policy: policy.as_ref(),
            capability: capability.as_ref(),
            queue,
            since: status_since(&timeline, operation.updated_at),
        });
        Ok(Description {
            operation,
            path,
            task,
            policy,
            capability,
            queue,
            why,
            timeline: timeline.into_iter().map(EventEnvelope::for_readers).collect(),
            described_at: now,
        })
    }

    /// The operation's events after stream version `after` (as readers see
    /// them: claim tokens as fingerprints), as they are appended: each poll (every `interval`) reads the stream from the last
    /// version it returned, never from the start. The stream ends only when
    /// a read fails (with that error); a reader stops it by dropping it.
    pub fn follow(
        &self,
        operation_id: OperationId,
        after: i64,
        interval: Duration,
    ) -> BoxStream<'static, Result<EventEnvelope, EngineError>> {
        let store = self.store.clone();
        let stream_id = StreamId::operation(operation_id);
        let state = (store, stream_id, after, false);
        stream::unfold(state, move |(store, stream_id, after, failed)| async move {
            if failed {
                return None;
            }
            let mut first = true;
            loop {
                if !first {
                    tokio::time::sleep(interval).await;
                }
                first = false;
                match store.read_stream_after(&stream_id, after, FOLLOW_PAGE).await {
                    Ok(events) if events.is_empty() => continue,
                    Ok(events) => {
                        let last = events.last().map_or(after, |event| event.stream_version);
                        let batch: Vec<Result<EventEnvelope, EngineError>> =
                            events.into_iter().map(|event| Ok(event.for_readers())).collect();
                        return Some((stream::iter(batch), (store, stream_id, last, false)));
                    }
                    Err(error) => {
                        let failure = vec![Err(EngineError::from(error))];
                        return Some((stream::iter(failure), (store, stream_id, after, true)));
                    }
                }
            }
        })
        .flatten()
        .boxed()
    }

    /// The dashboard summary now, then again each time the log's head moved
    /// (looked at every `interval`): a reader watching a ledger at rest
    /// reads one number per interval.
    pub fn watch_status(&self, interval: Duration) -> BoxStream<'static, Result<StatusReport, EngineError>> {
        let engine = self.clone();
        stream::unfold((engine, None::<i64>, false), move |(engine, seen, failed)| async move {
            if failed {
                return None;
            }
            loop {
                if seen.is_some() {
                    tokio::time::sleep(interval).await;
                }
                let head = match engine.store.head().await {
                    Ok(head) => head,
                    Err(error) => return Some((Err(error.into()), (engine, seen, true))),
                };
                if seen == Some(head) {
                    continue;
                }
                return match engine.status().await {
                    Ok(report) => {
                        let head = report.head;
                        Some((Ok(report), (engine, Some(head), false)))
                    }
                    Err(error) => Some((Err(error), (engine, seen, true))),
                };
            }
        })
        .boxed()
    }

    /// The retry policy of a declared kind (none for a kind only seen in a
    /// ledger written before declarations).
    async fn declared_policy(&self, kind: &str) -> Result<Option<RetryPolicy>, EngineError> {
        let key = task_kind_key(kind).key.to_string();
        Ok(
            match self
                .store
                .load_rows(&TASK_KINDS_TABLE, &[key])
                .await?
                .into_iter()
                .next()
            {
                Some(Row::TaskKind(row)) => row.declaration.map(|declaration| declaration.retry),
                _ => None,
            },
        )
    }

    async fn capability_of(&self, operation_id: OperationId) -> Result<Option<CapabilityRow>, EngineError> {
        let key = capability_key(operation_id).key.to_string();
        Ok(
            match self
                .store
                .load_rows(&CAPABILITY_STATES_TABLE, &[key])
                .await?
                .into_iter()
                .next()
            {
                Some(Row::Capability(row)) => Some(row),
                _ => None,
            },
        )
    }

    async fn queue_position(&self, task: &TaskView, now: Timestamp) -> Result<QueuePosition, EngineError> {
        let state = &task.state;
        let counted = self
            .store
            .claimable_ahead(&AheadQuery {
                target: state.target_type,
                kind: state.task_kind.clone(),
                task_version: state.task_version.clone(),
                priority: state.priority,
                available_at: state.available_at,
                operation_id: state.operation_id,
                statuses: CLAIMABLE_STATUSES,
                now,
                limit: QUEUE_COUNT_LIMIT,
            })
            .await?;
        Ok(QueuePosition {
            ahead: counted.ahead,
            higher_priority: counted.higher_priority,
            at_least: counted.ahead >= QUEUE_COUNT_LIMIT as u64,
        })
    }
}

/// Claimable now: queued or due for its retry.
fn is_waiting_for_a_claim(task: &TaskView, now: Timestamp) -> bool {
    matches!(
        task.state.status,
        OperationStatus::Queued | OperationStatus::RetryWaiting
    ) && task.state.available_at <= now
}

/// The running task's last progress: the lease's counters when a claim is
/// held, else the operation's last progress event.
fn progress_of(operation: &OperationRow, task: Option<&TaskView>) -> Option<ProgressNote> {
    if !operation.status.is_claimed() {
        return None;
    }
    if let Some(lease) = task.and_then(|task| task.lease.as_ref()) {
        if let Some(phase) = &lease.phase {
            return Some(ProgressNote {
                phase: phase.clone(),
                processed: lease.processed,
                total: lease.total,
            });
        }
    }
    operation.phase.as_ref().map(|phase| ProgressNote {
        phase: phase.clone(),
        processed: operation.processed,
        total: operation.total,
    })
}
