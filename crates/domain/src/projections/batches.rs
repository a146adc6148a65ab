//! `batches` and `batch_items`: named runs over a fixed set of items, with
//! exact progress and each item's outcome history.
//!
//! Progress is counted from the batch's own items as their settlements are
//! recorded on the batch's stream (`batch_item_settled`, appended by the
//! engine in the transaction that settles the item's operation), never by
//! aggregating processing states. A repeated settlement of a settled item
//! adds nothing, except that an item settled `blocked` (a need of its kind
//! ended without a result) takes a later settlement's outcome; an item
//! listed twice is one item. The status follows the
//! shared activity predicate (`crate::batches::is_active`).

use super::cells::{text_or_null, timestamp_or_null, Cell, CellReader, ColumnSpec, ColumnType, MapError, TableSpec};
use super::working_set::{Key, RowKey, WorkingSet};
use super::{ProjectionSpec, Projector, Row};
use crate::batches::{batch_status, BatchProgress, BatchStatus, ItemOutcome};
use crate::envelope::EventEnvelope;
use crate::error::FoldError;
use crate::events::Event;
use crate::ids::{BatchId, OperationId};
use crate::time::Timestamp;
use serde_json::{json, Value};

pub static BATCHES_TABLE: TableSpec = TableSpec {
    name: "batches",
    columns: &[
        ColumnSpec::required("batch_id", ColumnType::Uuid),
        ColumnSpec::required("name", ColumnType::Text),
        ColumnSpec::required("batch_kind", ColumnType::Text),
        ColumnSpec::required("task_kinds", ColumnType::Json),
        ColumnSpec::required("status", ColumnType::Text),
        ColumnSpec::required("cancel_requested", ColumnType::Bool),
        ColumnSpec::required("total", ColumnType::Integer),
        ColumnSpec::required("settled", ColumnType::Integer),
        ColumnSpec::required("succeeded", ColumnType::Integer),
        ColumnSpec::required("failed", ColumnType::Integer),
        ColumnSpec::required("skipped", ColumnType::Integer),
        ColumnSpec::required("cancelled", ColumnType::Integer),
        ColumnSpec::required("blocked", ColumnType::Integer),
        ColumnSpec::required("remaining", ColumnType::Integer),
        ColumnSpec::required("resumes", ColumnType::Integer),
        ColumnSpec::required("created_at", ColumnType::Timestamp),
        ColumnSpec::required("updated_at", ColumnType::Timestamp),
        ColumnSpec::required("version", ColumnType::Integer),
    ],
    key_columns: 1,
};

pub static BATCH_ITEMS_TABLE: TableSpec = TableSpec {
    name: "batch_items",
    columns: &[
        ColumnSpec::required("item_key", ColumnType::Text),
        ColumnSpec::required("batch_id", ColumnType::Uuid),
        ColumnSpec::required("operation_id", ColumnType::Uuid),
        ColumnSpec::required("position", ColumnType::Integer),
        ColumnSpec::required("label", ColumnType::Text),
        ColumnSpec::optional("outcome", ColumnType::Text),
        ColumnSpec::optional("last_status", ColumnType::Text),
        ColumnSpec::optional("reason", ColumnType::Text),
        ColumnSpec::required("runs", ColumnType::Integer),
        ColumnSpec::optional("settled_at", ColumnType::Timestamp),
        ColumnSpec::required("history", ColumnType::Json),
        ColumnSpec::required("updated_at", ColumnType::Timestamp),
    ],
    key_columns: 1,
};

pub static BATCHES: ProjectionSpec = ProjectionSpec {
    name: "batches",
    version: 3,
    tables: &[&BATCHES_TABLE, &BATCH_ITEMS_TABLE],
    question: "Which runs over which items exist, how far is each exactly, is it still active, and how did each item end each time it ran?",
    depends_on: &[],
};

#[derive(Debug, Clone, PartialEq)]
pub struct BatchRow {
    pub batch_id: BatchId,
    pub name: String,
    pub batch_kind: String,
    /// JSON array of the task kinds the batch requested.
    pub task_kinds: String,
    pub status: BatchStatus,
    pub cancel_requested: bool,
    pub progress: BatchProgress,
    pub resumes: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub version: i64,
}

impl BatchRow {
    pub fn to_cells(&self) -> Vec<Cell> {
        let progress = &self.progress;
        vec![
            Cell::Uuid(self.batch_id.0),
            Cell::Text(self.name.clone()),
            Cell::Text(self.batch_kind.clone()),
            Cell::Json(self.task_kinds.clone()),
            Cell::Text(self.status.as_str().to_string()),
            Cell::Bool(self.cancel_requested),
            Cell::Integer(progress.total),
            Cell::Integer(progress.settled),
            Cell::Integer(progress.succeeded),
            Cell::Integer(progress.failed),
            Cell::Integer(progress.skipped),
            Cell::Integer(progress.cancelled),
            Cell::Integer(progress.blocked),
            Cell::Integer(progress.remaining()),
            Cell::Integer(self.resumes),
            Cell::Timestamp(self.created_at),
            Cell::Timestamp(self.updated_at),
            Cell::Integer(self.version),
        ]
    }

    pub fn from_cells(cells: Vec<Cell>) -> Result<Self, MapError> {
        let mut reader = CellReader::new(&BATCHES_TABLE, cells);
        let batch_id = BatchId(reader.uuid()?);
        let name = reader.text()?;
        let batch_kind = reader.text()?;
        let task_kinds = reader.text()?;
        let status = reader.parsed()?;
        let cancel_requested = reader.boolean()?;
        let progress = BatchProgress {
            total: reader.integer()?,
            settled: reader.integer()?,
            succeeded: reader.integer()?,
            failed: reader.integer()?,
            skipped: reader.integer()?,
            cancelled: reader.integer()?,
            blocked: reader.integer()?,
        };
        // `remaining` is stored for dashboards; it is always total - settled.
        let _remaining = reader.integer()?;
        Ok(BatchRow {
            batch_id,
            name,
            batch_kind,
            task_kinds,
            status,
            cancel_requested,
            progress,
            resumes: reader.integer()?,
            created_at: reader.timestamp()?,
            updated_at: reader.timestamp()?,
            version: reader.integer()?,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct BatchItemRow {
    pub batch_id: BatchId,
    pub operation_id: OperationId,
    /// Order of the item in the batch, from 0.
    pub position: i64,
    pub label: String,
    /// How the item's latest run ended; None while it runs.
    pub outcome: Option<ItemOutcome>,
    pub last_status: Option<String>,
    pub reason: Option<String>,
    /// Runs so far: 1, plus one per resume that ran it again.
    pub runs: i64,
    pub settled_at: Option<Timestamp>,
    /// JSON array: every settlement and resume of the item, in order.
    pub history: String,
    pub updated_at: Timestamp,
}

impl BatchItemRow {
    pub fn to_cells(&self) -> Vec<Cell> {
        vec![
            Cell::Text(batch_item_id(self.batch_id, self.operation_id)),
            Cell::Uuid(self.batch_id.0),
            Cell::Uuid(self.operation_id.0),
            Cell::Integer(self.position),
            Cell::Text(self.label.clone()),
            self.outcome
                .map_or(Cell::Null, |outcome| Cell::Text(outcome.as_str().to_string())),
            text_or_null(&self.last_status),
            text_or_null(&self.reason),
            Cell::Integer(self.runs),
            timestamp_or_null(self.settled_at),
            Cell::Json(self.history.clone()),
            Cell::Timestamp(self.updated_at),
        ]
    }

    pub fn from_cells(cells: Vec<Cell>) -> Result<Self, MapError> {
        let mut reader = CellReader::new(&BATCH_ITEMS_TABLE, cells);
        let _item_key = reader.text()?;
        Ok(BatchItemRow {
            batch_id: BatchId(reader.uuid()?),
            operation_id: OperationId(reader.uuid()?),
            position: reader.integer()?,
            label: reader.text()?,
            outcome: reader.optional_parsed()?,
            last_status: reader.optional_text()?,
            reason: reader.optional_text()?,
            runs: reader.integer()?,
            settled_at: reader.optional_timestamp()?,
            history: reader.text()?,
            updated_at: reader.timestamp()?,
        })
    }

    fn push_history(&mut self, entry: Value) {
        let mut history: Vec<Value> = serde_json::from_str(&self.history).unwrap_or_default();
        history.push(entry);
        self.history = super::json_text(&Value::Array(history));
    }
}

/// The text key of a batch item: one item per operation per batch.
pub fn batch_item_id(batch_id: BatchId, operation_id: OperationId) -> String {
    format!("{batch_id}/{operation_id}")
}

pub fn batch_key(batch_id: BatchId) -> RowKey {
    RowKey::new(&BATCHES_TABLE, batch_id.key())
}

pub fn batch_item_key(batch_id: BatchId, operation_id: OperationId) -> RowKey {
    RowKey::new(&BATCH_ITEMS_TABLE, Key::Pair(batch_id.0, operation_id.0))
}

/// Folds batch events into `batches` and `batch_items`.
pub struct Batches;

impl Projector for Batches {
    fn spec(&self) -> &'static ProjectionSpec {
        &BATCHES
    }

    fn keys(&self, event: &EventEnvelope, keys: &mut Vec<RowKey>) {
        match &event.event {
            Event::BatchCreated(created) => keys.push(batch_key(created.batch_id)),
            Event::BatchItemsAdded(added) => {
                keys.push(batch_key(added.batch_id));
                keys.extend(
                    added
                        .items
                        .iter()
                        .map(|item| batch_item_key(added.batch_id, item.operation_id)),
                );
            }
            Event::BatchItemSettled(settled) => {
                keys.push(batch_key(settled.batch_id));
                keys.push(batch_item_key(settled.batch_id, settled.operation_id));
            }
            Event::BatchCancelRequested(cancel) => keys.push(batch_key(cancel.batch_id)),
            Event::BatchResumed(resumed) => {
                keys.push(batch_key(resumed.batch_id));
                keys.extend(
                    resumed
                        .operation_ids
                        .iter()
                        .map(|operation_id| batch_item_key(resumed.batch_id, *operation_id)),
                );
            }
            _ => {}
        }
    }

    fn apply(&self, event: &EventEnvelope, rows: &mut WorkingSet) -> Result<(), FoldError> {
        let fail = |reason: String| FoldError {
            seq: event.seq,
            event_type: event.event_type(),
            reason,
        };
        let batch_id = match &event.event {
            Event::BatchCreated(created) => {
                if rows.get(&batch_key(created.batch_id)).is_some() {
                    return Err(fail(format!("batch {} already exists", created.batch_id)));
                }
                rows.put(Row::Batch(BatchRow {
                    batch_id: created.batch_id,
                    name: created.name.clone(),
                    batch_kind: created.batch_kind.clone(),
                    task_kinds: super::json_text(&json!(created.task_kinds)),
                    status: BatchStatus::Completed,
                    cancel_requested: false,
                    progress: BatchProgress::default(),
                    resumes: 0,
                    created_at: event.recorded_at,
                    updated_at: event.recorded_at,
                    version: event.stream_version,
                }));
                return Ok(());
            }
            Event::BatchItemsAdded(added) => added.batch_id,
            Event::BatchItemSettled(settled) => settled.batch_id,
            Event::BatchCancelRequested(cancel) => cancel.batch_id,
            Event::BatchResumed(resumed) => resumed.batch_id,
            _ => return Ok(()),
        };
        let mut batch = match rows.get(&batch_key(batch_id)) {
            Some(Row::Batch(batch)) => batch.clone(),
            _ => return Err(fail(format!("batch {batch_id} does not exist"))),
        };
        match &event.event {
            Event::BatchItemsAdded(added) => {
                for item in &added.items {
                    let key = batch_item_key(batch_id, item.operation_id);
                    // Listed twice is one item: progress counts distinct items.
                    if rows.get(&key).is_some() {
                        continue;
                    }
                    rows.put(Row::BatchItem(BatchItemRow {
                        batch_id,
                        operation_id: item.operation_id,
                        position: batch.progress.total,
                        label: item.label.clone(),
                        outcome: None,
                        last_status: None,
                        reason: None,
                        runs: 1,
                        settled_at: None,
                        history: "[]".to_string(),
                        updated_at: event.recorded_at,
                    }));
                    batch.progress.total += 1;
                }
            }
            Event::BatchItemSettled(settled) => {
                let key = batch_item_key(batch_id, settled.operation_id);
                let Some(Row::BatchItem(item)) = rows.get(&key) else {
                    return Err(fail(format!(
                        "operation {} is not an item of batch {batch_id}",
                        settled.operation_id
                    )));
                };
                let outcome: ItemOutcome = settled.outcome.parse().map_err(fail)?;
                // A repeated report for a settled item adds nothing, but
                // an item settled `blocked` takes the outcome its work
                // reaches once a person cleared the need.
                match item.outcome {
                    None => {}
                    Some(earlier) if earlier.is_replaced_by(outcome) => batch.progress.unsettle(earlier),
                    Some(_) => return Ok(()),
                }
                let mut item = item.clone();
                item.outcome = Some(outcome);
                item.last_status = Some(settled.status.as_str().to_string());
                item.reason = settled.reason.clone();
                item.settled_at = Some(event.recorded_at);
                item.push_history(json!({
                    "seq": event.seq,
                    "at": event.recorded_at.to_string(),
                    "outcome": outcome.as_str(),
                    "status": settled.status.as_str(),
                    "reason": settled.reason,
                }));
                item.updated_at = event.recorded_at;
                batch.progress.settle(outcome);
                rows.put(Row::BatchItem(item));
            }
            Event::BatchCancelRequested(_) => {
                batch.cancel_requested = true;
            }
            Event::BatchResumed(resumed) => {
                batch.cancel_requested = false;
                batch.resumes += 1;
                for operation_id in &resumed.operation_ids {
                    let key = batch_item_key(batch_id, *operation_id);
                    let Some(Row::BatchItem(item)) = rows.get(&key) else {
                        return Err(fail(format!(
                            "operation {operation_id} is not an item of batch {batch_id}"
                        )));
                    };
                    let mut item = item.clone();
                    let Some(outcome) = item.outcome.filter(|outcome| outcome.is_resumable()) else {
                        return Err(fail(format!(
                            "item {operation_id} of batch {batch_id} is not failed or cancelled; only those resume"
                        )));
                    };
                    batch.progress.unsettle(outcome);
                    item.outcome = None;
                    item.settled_at = None;
                    item.runs += 1;
                    item.push_history(json!({
                        "seq": event.seq,
                        "at": event.recorded_at.to_string(),
                        "resumed": true,
                        "reason": resumed.reason,
                    }));
                    item.updated_at = event.recorded_at;
                    rows.put(Row::BatchItem(item));
                }
            }
            _ => {}
        }
        batch.status = batch_status(&batch.progress, batch.cancel_requested);
        batch.updated_at = event.recorded_at;
        batch.version = event.stream_version;
        rows.put(Row::Batch(batch));
        Ok(())
    }
}
