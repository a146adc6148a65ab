//! `review_queue`: the operations that need a person — terminal or
//! actionable states only, as the routing policy (`crate::review::route`)
//! decides — and how each entry was resolved.
//!
//! One row per operation: its latest entry. An entry opens when the
//! operation reaches a routed status (its id is the seq of the event that
//! opened it, so replay gives it the same id); it leaves the queue when a
//! recorded action resolves it (`review_resolved`: dismiss, acknowledge, or
//! retry — a retried entry closes when the work succeeds and a new entry
//! opens if it fails again), or when the work is requested anew by other
//! means. The row reads the operation's status off `media_operations`,
//! which folds first and is always rebuilt with this projection.
//!
//! Beside the rows it keeps `review_queue_counts`: one row (`by_state`)
//! counting entries by state, so the dashboard's queue size is one row
//! read. Entries never vanish by cascade (they outlive their media item as
//! history), so every change passes through this fold.

use super::cells::{
    text_or_null, timestamp_or_null, uuid_or_null, Cell, CellReader, ColumnSpec, ColumnType, MapError, TableSpec,
};
use super::counts::{add_count, counts_key, BY_STATE, REVIEW_COUNTS_TABLE};
use super::working_set::{RowKey, WorkingSet};
use super::{capability_key, operation_key, ProjectionSpec, Projector, Row};
use crate::envelope::EventEnvelope;
use crate::error::FoldError;
use crate::events::Event;
use crate::ids::{MediaId, OperationId};
use crate::review::{route, EntryState, ReviewAction};
use crate::status::OperationStatus;
use crate::time::Timestamp;

pub static REVIEW_TABLE: TableSpec = TableSpec {
    name: "review_queue",
    columns: &[
        ColumnSpec::required("operation_id", ColumnType::Uuid),
        ColumnSpec::required("entry_id", ColumnType::Integer),
        ColumnSpec::required("kind", ColumnType::Text),
        ColumnSpec::optional("media_id", ColumnType::Uuid),
        ColumnSpec::optional("path", ColumnType::Text),
        ColumnSpec::required("reason_code", ColumnType::Text),
        ColumnSpec::required("operation_status", ColumnType::Text),
        ColumnSpec::optional("detail", ColumnType::Text),
        ColumnSpec::required("state", ColumnType::Text),
        ColumnSpec::optional("resolution", ColumnType::Text),
        ColumnSpec::optional("resolution_reason", ColumnType::Text),
        ColumnSpec::optional("resolved_by", ColumnType::Text),
        ColumnSpec::required("opened_at", ColumnType::Timestamp),
        ColumnSpec::optional("resolved_at", ColumnType::Timestamp),
        ColumnSpec::required("updated_at", ColumnType::Timestamp),
    ],
    key_columns: 1,
};

pub static REVIEW_QUEUE: ProjectionSpec = ProjectionSpec {
    name: "review_queue",
    version: 3,
    tables: &[&REVIEW_TABLE, &REVIEW_COUNTS_TABLE],
    question: "Which operations need a person now, why, and how was each past entry resolved?",
    depends_on: &["media_operations", "entity_capability_states"],
};

#[derive(Debug, Clone, PartialEq)]
pub struct ReviewRow {
    pub operation_id: OperationId,
    /// The seq of the event that opened the entry.
    pub entry_id: i64,
    /// The operation's kind (a task kind or `ingestion.file`).
    pub kind: String,
    pub media_id: Option<MediaId>,
    pub path: Option<String>,
    pub reason_code: String,
    /// The operation's status when the entry last changed.
    pub operation_status: OperationStatus,
    /// The error or reason the operation recorded.
    pub detail: Option<String>,
    pub state: EntryState,
    pub resolution: Option<String>,
    pub resolution_reason: Option<String>,
    pub resolved_by: Option<String>,
    pub opened_at: Timestamp,
    pub resolved_at: Option<Timestamp>,
    pub updated_at: Timestamp,
}

impl ReviewRow {
    pub fn to_cells(&self) -> Vec<Cell> {
        vec![
            Cell::Uuid(self.operation_id.0),
            Cell::Integer(self.entry_id),
            Cell::Text(self.kind.clone()),
            uuid_or_null(self.media_id.map(|id| id.0)),
            text_or_null(&self.path),
            Cell::Text(self.reason_code.clone()),
            Cell::Text(self.operation_status.as_str().to_string()),
            text_or_null(&self.detail),
            Cell::Text(self.state.as_str().to_string()),
            text_or_null(&self.resolution),
            text_or_null(&self.resolution_reason),
            text_or_null(&self.resolved_by),
            Cell::Timestamp(self.opened_at),
            timestamp_or_null(self.resolved_at),
            Cell::Timestamp(self.updated_at),
        ]
    }

    pub fn from_cells(cells: Vec<Cell>) -> Result<Self, MapError> {
        let mut reader = CellReader::new(&REVIEW_TABLE, cells);
        Ok(ReviewRow {
            operation_id: OperationId(reader.uuid()?),
            entry_id: reader.integer()?,
            kind: reader.text()?,
            media_id: reader.optional_uuid()?.map(MediaId),
            path: reader.optional_text()?,
            reason_code: reader.text()?,
            operation_status: reader.parsed()?,
            detail: reader.optional_text()?,
            state: reader.parsed()?,
            resolution: reader.optional_text()?,
            resolution_reason: reader.optional_text()?,
            resolved_by: reader.optional_text()?,
            opened_at: reader.timestamp()?,
            resolved_at: reader.optional_timestamp()?,
            updated_at: reader.timestamp()?,
        })
    }
}

pub fn review_key(operation_id: OperationId) -> RowKey {
    RowKey::new(&REVIEW_TABLE, operation_id.key())
}

/// Folds operation outcomes and recorded resolutions into the queue.
pub struct ReviewQueue;

impl Projector for ReviewQueue {
    fn spec(&self) -> &'static ProjectionSpec {
        &REVIEW_QUEUE
    }

    fn keys(&self, event: &EventEnvelope, keys: &mut Vec<RowKey>) {
        if let Some(operation_id) = event.event.operation_id() {
            keys.push(review_key(operation_id));
            keys.push(operation_key(operation_id));
            keys.push(capability_key(operation_id));
            keys.push(counts_key(&REVIEW_COUNTS_TABLE, BY_STATE));
        }
    }

    fn apply(&self, event: &EventEnvelope, rows: &mut WorkingSet) -> Result<(), FoldError> {
        let Some(operation_id) = event.event.operation_id() else {
            return Ok(());
        };
        let key = review_key(operation_id);
        let state_of = |rows: &WorkingSet| match rows.get(&key) {
            Some(Row::Review(row)) => Some(row.state),
            _ => None,
        };
        let before = state_of(rows);
        fold_entry(event, operation_id, rows)?;
        let after = state_of(rows);
        if before != after {
            if let Some(before) = before {
                add_count(rows, &REVIEW_COUNTS_TABLE, BY_STATE, before.as_str(), -1);
            }
            if let Some(after) = after {
                add_count(rows, &REVIEW_COUNTS_TABLE, BY_STATE, after.as_str(), 1);
            }
        }
        Ok(())
    }
}

/// Folds one event of an operation into its review entry.
fn fold_entry(event: &EventEnvelope, operation_id: OperationId, rows: &mut WorkingSet) -> Result<(), FoldError> {
    let fail = |reason: String| FoldError {
        seq: event.seq,
        event_type: event.event_type(),
        reason,
    };
    let Some(Row::Operation(operation)) = rows.get(&operation_key(operation_id)) else {
        return Ok(());
    };
    let operation = operation.clone();
    let key = review_key(operation_id);
    let current = match rows.get(&key) {
        Some(Row::Review(row)) => Some(row.clone()),
        _ => None,
    };
    let detail = operation.last_error.clone().or_else(|| operation.status_reason.clone());

    if let Event::ReviewResolved(resolved) = &event.event {
        let Some(mut row) = current.filter(|row| row.entry_id == resolved.entry_id && row.state == EntryState::Open)
        else {
            return Err(fail(format!("review entry {} is not open", resolved.entry_id)));
        };
        let action: ReviewAction = resolved.action.parse().map_err(fail)?;
        row.state = match action {
            ReviewAction::Retry => EntryState::Retrying,
            ReviewAction::Dismiss | ReviewAction::Acknowledge => EntryState::Resolved,
        };
        row.resolution = Some(action.as_str().to_string());
        row.resolution_reason = Some(resolved.reason.clone());
        row.resolved_by = Some(event.actor.clone());
        if row.state == EntryState::Resolved {
            row.resolved_at = Some(event.recorded_at);
        }
        row.updated_at = event.recorded_at;
        rows.put(Row::Review(row));
        return Ok(());
    }

    // Whether the capability the operation produces is required, as its
    // capability row (folded first) says now.
    let required =
        matches!(rows.get(&capability_key(operation_id)), Some(Row::Capability(capability)) if capability.required);
    match (
        route(
            &operation.kind,
            operation.status,
            required,
            operation.blocked_on.as_ref(),
        ),
        current,
    ) {
        // Routed, and no entry is open: a new entry.
        (Some(code), current) if current.as_ref().is_none_or(|row| row.state != EntryState::Open) => {
            rows.put(Row::Review(ReviewRow {
                operation_id,
                entry_id: event.seq,
                kind: operation.kind.clone(),
                media_id: operation.media_id,
                path: operation.path.clone(),
                reason_code: code.as_str().to_string(),
                operation_status: operation.status,
                detail,
                state: EntryState::Open,
                resolution: None,
                resolution_reason: None,
                resolved_by: None,
                opened_at: event.recorded_at,
                resolved_at: None,
                updated_at: event.recorded_at,
            }));
        }
        // Routed and open: follow a change of reason (blocked, then failed).
        (Some(code), Some(mut row)) => {
            if row.reason_code != code.as_str() || row.operation_status != operation.status || row.detail != detail {
                row.reason_code = code.as_str().to_string();
                row.operation_status = operation.status;
                row.detail = detail;
                row.updated_at = event.recorded_at;
                rows.put(Row::Review(row));
            }
        }
        (None, Some(mut row)) => match row.state {
            // The work was requested anew by other means: it is no longer
            // a person's business.
            EntryState::Open => {
                row.state = EntryState::Superseded;
                row.operation_status = operation.status;
                row.resolved_at = Some(event.recorded_at);
                row.updated_at = event.recorded_at;
                rows.put(Row::Review(row));
            }
            // A retry from the queue closes its entry once it succeeds.
            EntryState::Retrying if operation.status.is_terminal() => {
                row.state = EntryState::Resolved;
                row.operation_status = operation.status;
                row.resolved_at = Some(event.recorded_at);
                row.updated_at = event.recorded_at;
                rows.put(Row::Review(row));
            }
            EntryState::Retrying | EntryState::Resolved | EntryState::Superseded => {}
        },
        (Some(_), None) | (None, None) => {}
    }
    Ok(())
}
