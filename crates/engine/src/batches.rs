//! Batches: create a named run over a fixed set of items, follow its exact
//! progress, cancel it, resume it; and the completion reconciliation that
//! records each item's outcome when its operation settles.
//!
//! An item's settlement is recorded on the batch's stream in the same
//! transaction as the event that settles its operation (the batch
//! settlement reaction every command's commit runs), so a batch's
//! progress is never behind its items and never computed from processing
//! states. [`Engine::reconcile_batches`] runs the same check over every
//! active batch (at startup and on demand) and uses the same activity
//! predicate as the projection and the queries
//! (`opledger_domain::batches::is_active`).

use crate::error::EngineError;
use crate::idempotency::Once;
use crate::load::load_operations;
use crate::reactions::settlement_reason;
use crate::tx::{commit_appends, CommandContext, Decided, Stamp};
use crate::work::{request_in_tx, TaskRequest, TaskTarget};
use crate::Engine;
use opledger_domain::batches::{
    decide_item_cancel, decide_item_resume, is_active, item_outcome, settled_outcome, ItemOutcome,
};
use opledger_domain::events::{
    BatchCancelRequested, BatchCreated, BatchItemSettled, BatchItemSpec, BatchItemsAdded, BatchResumed, Event,
};
use opledger_domain::projections::{
    batch_key, BatchItemRow, BatchRow, Cell, OperationRow, Row, RowKey, WorkingSet, BATCHES_TABLE, BATCH_ITEMS_TABLE,
};
use opledger_domain::{BatchId, MediaId, NewEvent, OperationId, StreamId};
use opledger_store::{ExpectedVersion, Store, StreamAppend, WriteTx};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// Items per `batch_items_added` event: the set is fixed at creation, but
/// no single event should be huge.
const ITEMS_PER_EVENT: usize = 1_000;

/// The most items one batch may hold.
pub const MAX_BATCH_ITEMS: usize = 1_000_000;

/// A batch of task requests: every kind on every media item.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRequest {
    pub name: String,
    pub media: Vec<MediaId>,
    pub kinds: Vec<String>,
    /// Inputs per kind; what is left out takes the kind's declared defaults.
    pub inputs: BTreeMap<String, Value>,
    pub priority: i32,
}

/// What cancelling a batch did to its items.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchCancelCounts {
    /// The items the batch holds.
    pub items: usize,
    /// Waiting or blocked items, cancelled at once.
    pub cancelled: usize,
    /// Running items asked to stop: each settles `cancelled` when its
    /// worker acknowledges at its next heartbeat.
    pub asked_to_stop: usize,
    /// Running items an earlier cancel already asked to stop.
    pub already_stopping: usize,
    /// Items settled before the cancel (succeeded, failed, skipped,
    /// cancelled), left as they are.
    pub already_settled: usize,
    /// Unsettled items whose status takes no cancel now (interrupted or
    /// failed and about to be retried); recovery or the retry settles them.
    pub not_cancellable: usize,
}

impl BatchCancelCounts {
    fn count(&mut self, operation: &OperationRow, decided: Option<&Event>) {
        let count = match decided {
            Some(Event::OperationCancelled(_)) => &mut self.cancelled,
            Some(_) => &mut self.asked_to_stop,
            None if operation.status.is_terminal() => &mut self.already_settled,
            None if operation.status.is_claimed() => &mut self.already_stopping,
            None => &mut self.not_cancellable,
        };
        *count += 1;
    }
}

/// A batch with its items.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchView {
    #[serde(skip)]
    pub batch: BatchRow,
    #[serde(skip)]
    pub items: Vec<BatchItemRow>,
    /// The shared activity predicate's answer.
    pub active: bool,
}

impl<S: Store> Engine<S> {
    /// Creates a batch: requests every kind on every item (a revision
    /// already requested or done is not requested again) and records the
    /// batch over the resulting operations, all in one transaction. Items
    /// whose work is already settled settle in the batch at once (work
    /// already done at this revision counts as `skipped`). Any refused
    /// request refuses the whole batch: nothing is written.
    pub async fn create_batch(
        &self,
        context: &CommandContext,
        request: BatchRequest,
    ) -> Result<BatchView, EngineError> {
        let name = request.name.trim().to_string();
        if name.is_empty() {
            return Err(EngineError::invalid("a batch needs a name"));
        }
        if request.media.is_empty() || request.kinds.is_empty() {
            return Err(EngineError::invalid(
                "a batch needs at least one media item and one task kind",
            ));
        }
        let mut kinds: Vec<String> = Vec::new();
        for kind in &request.kinds {
            if !kinds.iter().any(|known| known == kind) {
                kinds.push(kind.clone());
            }
        }
        if let Some(unused) = request.inputs.keys().find(|kind| !kinds.contains(kind)) {
            return Err(EngineError::invalid(format!(
                "inputs given for {unused}, which the batch does not request"
            )));
        }
        // Distinct items, in the order given: a duplicate is one item.
        let mut seen = BTreeSet::new();
        let media: Vec<MediaId> = request.media.into_iter().filter(|id| seen.insert(*id)).collect();
        if media.len() * kinds.len() > MAX_BATCH_ITEMS {
            return Err(EngineError::invalid(format!(
                "a batch holds at most {MAX_BATCH_ITEMS} items"
            )));
        }
        let once = context.once(
            "batch.create",
            json!({
                "name": name,
                "media": media,
                "kinds": kinds,
                "inputs": request.inputs,
                "priority": request.priority,
            }),
        );
        let mut requests = Vec::with_capacity(media.len() * kinds.len());
        for media_id in &media {
            for kind in &kinds {
                let inputs = request
                    .inputs
                    .get(kind)
                    .cloned()
                    .unwrap_or_else(|| Value::Object(serde_json::Map::new()));
                requests.push(TaskRequest {
                    target: TaskTarget::Media(*media_id),
                    kind: kind.clone(),
                    inputs,
                    priority: request.priority,
                });
            }
        }
        self.create_task_batch_once(context, once, name, kinds, requests).await
    }

    /// Creates a batch of these task requests (each at its own inputs),
    /// as [`Engine::create_batch`] does for every kind on every item.
    pub(crate) async fn create_task_batch(
        &self,
        context: &CommandContext,
        name: String,
        kinds: Vec<String>,
        requests: Vec<TaskRequest>,
    ) -> Result<BatchView, EngineError> {
        context.refuse_request_id("creating a batch of task requests")?;
        self.create_task_batch_once(context, None, name, kinds, requests).await
    }

    /// [`Engine::create_task_batch`] recorded as `once`: a retry answers
    /// the batch the first attempt created (as it stands now).
    async fn create_task_batch_once(
        &self,
        context: &CommandContext,
        once: Option<Once>,
        name: String,
        kinds: Vec<String>,
        requests: Vec<TaskRequest>,
    ) -> Result<BatchView, EngineError> {
        let labels: Vec<String> = requests
            .iter()
            .map(|request| match request.target {
                TaskTarget::Media(media_id) => format!("{media_id}/{}", request.kind),
                TaskTarget::Region(region_id) => format!("region {region_id}/{}", request.kind),
            })
            .collect();
        let prepared = self.prepare_requests(requests);
        let batch_id = BatchId(self.ids.next());
        let stamp = self.stamp(&batch_context(context, batch_id));
        // The answer is the batch's id: a retry reads the batch the first
        // attempt created, not the id this attempt would have made.
        let batch_id = self
            .stamped_once(once, stamp, move |tx, rows, stamp| {
                Box::pin(async move {
                    let (answers, mut appends) = request_in_tx(tx, rows, prepared, &stamp).await?;
                    let mut items = Vec::with_capacity(answers.len());
                    let mut untouched = Vec::new();
                    for (answer, label) in answers.into_iter().zip(labels) {
                        let outcome = answer?;
                        if !outcome.created {
                            untouched.push(outcome.operation_id);
                        }
                        items.push(BatchItemSpec {
                            operation_id: outcome.operation_id,
                            label,
                        });
                    }
                    appends.push(batch_creation(&stamp, batch_id, name, "tasks", kinds, items));
                    // The batch's items are read back by the settlements below.
                    commit_appends(tx, rows, appends).await?;
                    // Work the batch did not touch may be settled already.
                    let (_, settlements) = untouched_settlements(tx, rows, &stamp, batch_id, &untouched, true).await?;
                    Ok(Decided::answer(batch_id, settlements))
                })
            })
            .await?;
        self.batch(batch_id).await
    }

    /// Creates a batch over operations that exist (an ingest run's file
    /// operations), in one transaction. Items already settled settle in the
    /// batch at once: with their own outcome, or, with `done_is_skipped`,
    /// a success as `skipped` (an unchanged file the run did not process).
    pub async fn create_batch_over(
        &self,
        context: &CommandContext,
        batch_id: BatchId,
        name: &str,
        batch_kind: &str,
        items: Vec<BatchItemSpec>,
        done_is_skipped: bool,
    ) -> Result<BatchView, EngineError> {
        let name = name.trim().to_string();
        if name.is_empty() {
            return Err(EngineError::invalid("a batch needs a name"));
        }
        if items.len() > MAX_BATCH_ITEMS {
            return Err(EngineError::invalid(format!(
                "a batch holds at most {MAX_BATCH_ITEMS} items"
            )));
        }
        let batch_kind = batch_kind.to_string();
        let stamp = self.stamp(&batch_context(context, batch_id));
        self.stamped(stamp, move |tx, rows, stamp| {
            Box::pin(async move {
                let operation_ids: Vec<OperationId> = items.iter().map(|item| item.operation_id).collect();
                let operations = load_operations(tx, rows, &operation_ids).await?;
                if let Some(missing) = operation_ids.iter().find(|id| !operations.contains_key(id)) {
                    return Err(EngineError::not_found("operation", missing));
                }
                let append = batch_creation(&stamp, batch_id, name, &batch_kind, Vec::new(), items);
                // The batch's items are read back by the settlements below.
                commit_appends(tx, rows, vec![append]).await?;
                let (_, settlements) =
                    untouched_settlements(tx, rows, &stamp, batch_id, &operation_ids, done_is_skipped).await?;
                Ok(Decided::answer((), settlements))
            })
        })
        .await?;
        self.batch(batch_id).await
    }

    /// A batch with its items, in item order.
    pub async fn batch(&self, batch_id: BatchId) -> Result<BatchView, EngineError> {
        let batch = match self
            .store
            .load_rows(&BATCHES_TABLE, &[batch_id.to_string()])
            .await?
            .into_iter()
            .next()
        {
            Some(Row::Batch(batch)) => batch,
            _ => return Err(EngineError::not_found("batch", batch_id)),
        };
        let mut items: Vec<BatchItemRow> = self
            .store
            .find_rows(&BATCH_ITEMS_TABLE, &[("batch_id", Cell::Uuid(batch_id.0))], usize::MAX)
            .await?
            .into_iter()
            .filter_map(|row| match row {
                Row::BatchItem(item) => Some(item),
                _ => None,
            })
            .collect();
        items.sort_by_key(|item| item.position);
        Ok(BatchView {
            active: is_active(&batch.progress),
            batch,
            items,
        })
    }

    /// Every batch, or only the active ones (by the activity predicate),
    /// newest first.
    pub async fn batches(&self, active_only: bool) -> Result<Vec<BatchRow>, EngineError> {
        let mut batches: Vec<BatchRow> = self
            .store
            .scan_table(&BATCHES_TABLE)
            .await?
            .into_iter()
            .filter_map(|row| match row {
                Row::Batch(batch) => Some(batch),
                _ => None,
            })
            .filter(|batch| !active_only || is_active(&batch.progress))
            .collect();
        batches.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.batch_id.cmp(&a.batch_id)));
        Ok(batches)
    }

    /// Cancels a batch: waiting and blocked items are cancelled at once,
    /// running ones asked to stop (they settle as cancelled when their
    /// workers acknowledge). Refused when nothing in it is unsettled or
    /// blocked.
    pub async fn cancel_batch(
        &self,
        context: &CommandContext,
        batch_id: BatchId,
        reason: &str,
    ) -> Result<BatchView, EngineError> {
        Ok(self.cancel_batch_counted(context, batch_id, reason).await?.0)
    }

    /// [`Engine::cancel_batch`], with what the cancel did to the batch's
    /// items. Items settled `blocked` (a need of their kind ended without a
    /// result) are cancelled too: they are waiting work that would run if
    /// a person cleared the need. A retry under the cancel's request id
    /// answers the first attempt's counts.
    pub async fn cancel_batch_counted(
        &self,
        context: &CommandContext,
        batch_id: BatchId,
        reason: &str,
    ) -> Result<(BatchView, BatchCancelCounts), EngineError> {
        let reason = non_empty(reason, "batch cancelled");
        let once = context.once("batch.cancel", json!({"batch_id": batch_id, "reason": reason}));
        let stamp = self.stamp(&batch_context(context, batch_id));
        // Optional: a cancel recorded before the counts were answered
        // answers none when retried.
        let counts: Option<BatchCancelCounts> = self
            .stamped_once(once, stamp, move |tx, rows, stamp| {
                Box::pin(async move {
                    let (batch, items) = load_batch(tx, rows, batch_id).await?;
                    let open: Vec<OperationId> = items
                        .iter()
                        .filter(|item| item.outcome.is_none_or(|outcome| outcome == ItemOutcome::Blocked))
                        .map(|item| item.operation_id)
                        .collect();
                    if open.is_empty() {
                        return Err(EngineError::Domain(opledger_domain::DomainError::Conflict(format!(
                            "batch {batch_id} is {}: nothing left to cancel",
                            batch.status
                        ))));
                    }
                    let operations = load_operations(tx, rows, &open).await?;
                    let mut counts = BatchCancelCounts {
                        items: items.len(),
                        already_settled: items.len() - open.len(),
                        ..BatchCancelCounts::default()
                    };
                    let mut appends = vec![StreamAppend {
                        stream_id: StreamId::batch(batch_id),
                        expected: ExpectedVersion::Exactly(batch.version),
                        events: vec![stamp.event(Event::BatchCancelRequested(BatchCancelRequested {
                            batch_id,
                            reason: reason.clone(),
                        }))],
                    }];
                    for operation in operations.values() {
                        let event = decide_item_cancel(
                            operation.operation_id,
                            operation.status,
                            operation.cancel_requested,
                            &reason,
                        );
                        counts.count(operation, event.as_ref());
                        if let Some(event) = event {
                            appends.push(operation_append(operation, vec![stamp.event(event)]));
                        }
                    }
                    Ok(Decided::answer(Some(counts), appends))
                })
            })
            .await?;
        Ok((self.batch(batch_id).await?, counts.unwrap_or_default()))
    }

    /// Resumes a batch: every item that ended failed or cancelled runs
    /// again (its operation reopened with a fresh budget), in the same
    /// batch; succeeded and skipped items are left alone. Refused when no
    /// item is failed or cancelled.
    pub async fn resume_batch(
        &self,
        context: &CommandContext,
        batch_id: BatchId,
        reason: &str,
    ) -> Result<BatchView, EngineError> {
        let reason = non_empty(reason, "batch resumed");
        let once = context.once("batch.resume", json!({"batch_id": batch_id, "reason": reason}));
        let stamp = self.stamp(&batch_context(context, batch_id));
        self.stamped_once(once, stamp, move |tx, rows, stamp| {
            Box::pin(async move {
                let (batch, items) = load_batch(tx, rows, batch_id).await?;
                let resumable: Vec<OperationId> = items
                    .iter()
                    .filter(|item| item.outcome.is_some_and(ItemOutcome::is_resumable))
                    .map(|item| item.operation_id)
                    .collect();
                if resumable.is_empty() {
                    return Err(EngineError::Domain(opledger_domain::DomainError::Conflict(format!(
                        "batch {batch_id} has no failed or cancelled items to resume"
                    ))));
                }
                let operations = load_operations(tx, rows, &resumable).await?;
                let mut appends = vec![StreamAppend {
                    stream_id: StreamId::batch(batch_id),
                    expected: ExpectedVersion::Exactly(batch.version),
                    events: vec![stamp.event(Event::BatchResumed(BatchResumed {
                        batch_id,
                        operation_ids: resumable.clone(),
                        reason: reason.clone(),
                    }))],
                }];
                for operation_id in &resumable {
                    let operation = operations
                        .get(operation_id)
                        .ok_or_else(|| EngineError::not_found("operation", operation_id))?;
                    // Settled anew outside the batch (a retry from the
                    // review queue that succeeded): nothing to reopen; the
                    // item settles again from its current status below.
                    if settled_outcome(operation.status).is_some_and(|outcome| !outcome.is_resumable()) {
                        continue;
                    }
                    if !operation.status.is_terminal() {
                        continue;
                    }
                    let event = decide_item_resume(operation.operation_id, operation.status, &reason)?;
                    appends.push(operation_append(operation, vec![stamp.event(event)]));
                }
                // The reopened items are read back by the settlements below.
                commit_appends(tx, rows, appends).await?;
                let (_, settlements) = untouched_settlements(tx, rows, &stamp, batch_id, &resumable, false).await?;
                Ok(Decided::answer((), settlements))
            })
        })
        .await?;
        self.batch(batch_id).await
    }

    /// Completion reconciliation: for every active batch, records the
    /// outcome of each unsettled item whose operation has settled (work that
    /// settled while the batch's own record lagged, e.g. across an upgrade).
    /// Returns how many items it settled. Run by startup.
    pub async fn reconcile_batches(&self, context: &CommandContext) -> Result<usize, EngineError> {
        let mut settled = 0;
        for batch in self.batches(true).await? {
            let batch_id = batch.batch_id;
            let stamp = self.stamp(&batch_context(context, batch_id));
            settled += self
                .stamped(stamp, move |tx, rows, stamp| {
                    Box::pin(async move {
                        let (_, items) = load_batch(tx, rows, batch_id).await?;
                        let unsettled: Vec<OperationId> = items
                            .iter()
                            .filter(|item| item.outcome.is_none())
                            .map(|item| item.operation_id)
                            .collect();
                        let (settled, settlements) =
                            untouched_settlements(tx, rows, &stamp, batch_id, &unsettled, false).await?;
                        Ok(Decided::answer(settled, settlements))
                    })
                })
                .await?;
        }
        Ok(settled)
    }
}

/// A batch's commands share its id as their correlation id, so every event
/// of the run can be found together.
fn batch_context(context: &CommandContext, batch_id: BatchId) -> CommandContext {
    let mut context = context.clone();
    if context.correlation_id.is_none() {
        context.correlation_id = Some(format!("batch-{batch_id}"));
    }
    context
}

fn non_empty(reason: &str, default: &str) -> String {
    if reason.trim().is_empty() {
        default.to_string()
    } else {
        reason.trim().to_string()
    }
}

fn batch_creation(
    stamp: &Stamp,
    batch_id: BatchId,
    name: String,
    batch_kind: &str,
    task_kinds: Vec<String>,
    items: Vec<BatchItemSpec>,
) -> StreamAppend {
    let mut events = vec![stamp.event(Event::BatchCreated(BatchCreated {
        batch_id,
        name,
        batch_kind: batch_kind.to_string(),
        task_kinds,
    }))];
    let mut seen = BTreeSet::new();
    let items: Vec<BatchItemSpec> = items
        .into_iter()
        .filter(|item| seen.insert(item.operation_id))
        .collect();
    for chunk in items.chunks(ITEMS_PER_EVENT) {
        events.push(stamp.event(Event::BatchItemsAdded(BatchItemsAdded {
            batch_id,
            items: chunk.to_vec(),
        })));
    }
    StreamAppend {
        stream_id: StreamId::batch(batch_id),
        expected: ExpectedVersion::NoStream,
        events,
    }
}

fn operation_append(operation: &OperationRow, events: Vec<NewEvent>) -> StreamAppend {
    StreamAppend {
        stream_id: StreamId::operation(operation.operation_id),
        expected: ExpectedVersion::Exactly(operation.version),
        events,
    }
}

async fn load_batch<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    batch_id: BatchId,
) -> Result<(BatchRow, Vec<BatchItemRow>), EngineError> {
    let key = batch_key(batch_id);
    let batch = match tx.load_rows(&BATCHES_TABLE, &[key.key.to_string()]).await?.pop() {
        Some(Row::Batch(batch)) => batch,
        _ => return Err(EngineError::not_found("batch", batch_id)),
    };
    rows.insert_loaded(key, Some(Row::Batch(batch.clone())));
    let mut items = Vec::new();
    for row in tx
        .find_rows(&BATCH_ITEMS_TABLE, &[("batch_id", Cell::Uuid(batch_id.0))], usize::MAX)
        .await?
    {
        if let Row::BatchItem(item) = row {
            rows.insert_loaded(
                RowKey::new(&BATCH_ITEMS_TABLE, item_id(&item)),
                Some(Row::BatchItem(item.clone())),
            );
            items.push(item);
        }
    }
    items.sort_by_key(|item| item.position);
    Ok((batch, items))
}

fn item_id(item: &BatchItemRow) -> String {
    opledger_domain::projections::batch_item_id(item.batch_id, item.operation_id)
}

/// The settlements of the batch's unsettled items among `operation_ids`
/// whose operations are settled now, with their outcome; with
/// `done_is_skipped` (items the batch found already done and did not
/// request again) a success counts as `skipped`. How many settle, and the
/// append that records them (none when nothing settles).
async fn untouched_settlements<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    stamp: &Stamp,
    batch_id: BatchId,
    operation_ids: &[OperationId],
    done_is_skipped: bool,
) -> Result<(usize, Vec<StreamAppend>), EngineError> {
    if operation_ids.is_empty() {
        return Ok((0, Vec::new()));
    }
    let operations = load_operations(tx, rows, operation_ids).await?;
    let (_, items) = load_batch(tx, rows, batch_id).await?;
    let mut events = Vec::new();
    let wanted: BTreeSet<&OperationId> = operation_ids.iter().collect();
    for item in items
        .iter()
        .filter(|item| item.outcome.is_none() && wanted.contains(&item.operation_id))
    {
        let Some(operation) = operations.get(&item.operation_id) else {
            continue;
        };
        let Some(outcome) = item_outcome(operation.status, operation.blocked_on.as_ref()) else {
            continue;
        };
        let (outcome, reason) = if done_is_skipped && outcome == ItemOutcome::Succeeded {
            (
                ItemOutcome::Skipped,
                Some("already done at the requested revision".to_string()),
            )
        } else {
            (outcome, settlement_reason(outcome, operation))
        };
        events.push(stamp.event(Event::BatchItemSettled(BatchItemSettled {
            batch_id,
            operation_id: item.operation_id,
            outcome: outcome.as_str().to_string(),
            status: operation.status,
            reason,
        })));
    }
    let settled = events.len();
    let appends = if settled > 0 {
        vec![StreamAppend {
            stream_id: StreamId::batch(batch_id),
            expected: ExpectedVersion::Any,
            events,
        }]
    } else {
        Vec::new()
    };
    Ok((settled, appends))
}
