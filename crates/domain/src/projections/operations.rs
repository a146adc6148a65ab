//! `media_operations`: one row per operation, its current status, stage,
//! claim and last outcome. The operation's timeline is its event stream.

use super::cells::{
    integer_or_null, text_or_null, timestamp_or_null, uuid_or_null, Cell, CellReader, ColumnSpec, ColumnType, MapError,
    TableSpec,
};
use super::counts::{add_count, counts_key, OPERATION_COUNTS_TABLE};
use super::working_set::{RowKey, WorkingSet};

/// The counts row of operations by status (`media_operation_counts`).
pub const BY_STATUS: &str = "by_status";
use super::{ProjectionSpec, Projector, Row};
use crate::envelope::EventEnvelope;
use crate::error::FoldError;
use crate::events::Event;
use crate::ids::{MediaId, OperationId, RegionId};
use crate::kinds::BlockedOn;
pub use crate::status::INGESTION_FILE;
use crate::status::{IngestionStage, OperationStatus};
use crate::time::Timestamp;
use crate::transitions::{self, INITIAL_STATUSES};

pub static OPERATIONS_TABLE: TableSpec = TableSpec {
    name: "media_operations",
    columns: &[
        ColumnSpec::required("id", ColumnType::Uuid),
        ColumnSpec::required("kind", ColumnType::Text),
        ColumnSpec::optional("media_id", ColumnType::Uuid),
        ColumnSpec::optional("region_id", ColumnType::Uuid),
        ColumnSpec::optional("path", ColumnType::Text),
        ColumnSpec::optional("revision", ColumnType::Text),
        ColumnSpec::required("inputs", ColumnType::Json),
        ColumnSpec::required("status", ColumnType::Text),
        ColumnSpec::optional("stage", ColumnType::Text),
        ColumnSpec::required("priority", ColumnType::Integer),
        ColumnSpec::required("attempt_count", ColumnType::Integer),
        ColumnSpec::required("interruption_count", ColumnType::Integer),
        ColumnSpec::optional("claim_token", ColumnType::Text),
        ColumnSpec::optional("worker", ColumnType::Text),
        ColumnSpec::optional("lease_expires_at", ColumnType::Timestamp),
        ColumnSpec::optional("available_at", ColumnType::Timestamp),
        ColumnSpec::required("cancel_requested", ColumnType::Bool),
        ColumnSpec::optional("phase", ColumnType::Text),
        ColumnSpec::optional("processed", ColumnType::Integer),
        ColumnSpec::optional("total", ColumnType::Integer),
        ColumnSpec::optional("last_error", ColumnType::Text),
        ColumnSpec::optional("status_reason", ColumnType::Text),
        ColumnSpec::optional("blocked_on", ColumnType::Text),
        ColumnSpec::optional("blocked_on_status", ColumnType::Text),
        ColumnSpec::required("created_at", ColumnType::Timestamp),
        ColumnSpec::required("updated_at", ColumnType::Timestamp),
        ColumnSpec::required("version", ColumnType::Integer),
    ],
    key_columns: 1,
};

pub static MEDIA_OPERATIONS: ProjectionSpec = ProjectionSpec {
    name: "media_operations",
    version: 6,
    tables: &[&OPERATIONS_TABLE, &OPERATION_COUNTS_TABLE],
    question: "What work exists, where does each operation stand, who holds it, and why is it waiting or failed?",
    depends_on: &[],
};

/// One operation.
#[derive(Debug, Clone, PartialEq)]
pub struct OperationRow {
    pub operation_id: OperationId,
    pub kind: String,
    pub media_id: Option<MediaId>,
    pub region_id: Option<RegionId>,
    pub path: Option<String>,
    pub revision: Option<String>,
    /// Canonical JSON text of the task inputs.
    pub inputs: String,
    pub status: OperationStatus,
    pub stage: Option<IngestionStage>,
    pub priority: i64,
    /// Claims taken: every claim is an attempt.
    pub attempt_count: i64,
    /// Claims lost to crashes or expired leases, counted apart from errors.
    pub interruption_count: i64,
    pub claim_token: Option<String>,
    pub worker: Option<String>,
    pub lease_expires_at: Option<Timestamp>,
    /// When the operation may next be claimed.
    pub available_at: Option<Timestamp>,
    pub cancel_requested: bool,
    pub phase: Option<String>,
    pub processed: Option<i64>,
    pub total: Option<i64>,
    pub last_error: Option<String>,
    /// The reason recorded with the latest status change.
    pub status_reason: Option<String>,
    /// For an operation blocked by its kind's `needs`: the need it waits
    /// for, and where that stood when the block was recorded.
    pub blocked_on: Option<BlockedOn>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// The operation stream's version after the last event folded in.
    pub version: i64,
}

impl OperationRow {
    pub fn to_cells(&self) -> Vec<Cell> {
        vec![
            Cell::Uuid(self.operation_id.0),
            Cell::Text(self.kind.clone()),
            uuid_or_null(self.media_id.map(|id| id.0)),
            uuid_or_null(self.region_id.map(|id| id.0)),
            text_or_null(&self.path),
            text_or_null(&self.revision),
            Cell::Json(self.inputs.clone()),
            Cell::Text(self.status.as_str().to_string()),
            self.stage
                .map_or(Cell::Null, |stage| Cell::Text(stage.as_str().to_string())),
            Cell::Integer(self.priority),
            Cell::Integer(self.attempt_count),
            Cell::Integer(self.interruption_count),
            text_or_null(&self.claim_token),
            text_or_null(&self.worker),
            timestamp_or_null(self.lease_expires_at),
            timestamp_or_null(self.available_at),
            Cell::Bool(self.cancel_requested),
            text_or_null(&self.phase),
            integer_or_null(self.processed),
            integer_or_null(self.total),
            text_or_null(&self.last_error),
            text_or_null(&self.status_reason),
            self.blocked_on
                .as_ref()
                .map_or(Cell::Null, |need| Cell::Text(need.capability.clone())),
            self.blocked_on
                .as_ref()
                .and_then(|need| need.status)
                .map_or(Cell::Null, |status| Cell::Text(status.as_str().to_string())),
            Cell::Timestamp(self.created_at),
            Cell::Timestamp(self.updated_at),
            Cell::Integer(self.version),
        ]
    }

    pub fn from_cells(cells: Vec<Cell>) -> Result<Self, MapError> {
        let mut reader = CellReader::new(&OPERATIONS_TABLE, cells);
        Ok(OperationRow {
            operation_id: OperationId(reader.uuid()?),
            kind: reader.text()?,
            media_id: reader.optional_uuid()?.map(MediaId),
            region_id: reader.optional_uuid()?.map(RegionId),
            path: reader.optional_text()?,
            revision: reader.optional_text()?,
            inputs: reader.text()?,
            status: reader.parsed()?,
            stage: reader.optional_parsed()?,
            priority: reader.integer()?,
            attempt_count: reader.integer()?,
            interruption_count: reader.integer()?,
            claim_token: reader.optional_text()?,
            worker: reader.optional_text()?,
            lease_expires_at: reader.optional_timestamp()?,
            available_at: reader.optional_timestamp()?,
            cancel_requested: reader.boolean()?,
            phase: reader.optional_text()?,
            processed: reader.optional_integer()?,
            total: reader.optional_integer()?,
            last_error: reader.optional_text()?,
            status_reason: reader.optional_text()?,
            blocked_on: {
                let capability = reader.optional_text()?;
                let status = reader.optional_parsed()?;
                capability.map(|capability| BlockedOn { capability, status })
            },
            created_at: reader.timestamp()?,
            updated_at: reader.timestamp()?,
            version: reader.integer()?,
        })
    }

    fn clear_claim(&mut self) {
        self.claim_token = None;
        self.worker = None;
        self.lease_expires_at = None;
    }
}

pub fn operation_key(operation_id: OperationId) -> RowKey {
    RowKey::new(&OPERATIONS_TABLE, operation_id.key())
}

/// Folds operation events into `media_operations`.
pub struct MediaOperations;

impl Projector for MediaOperations {
    fn spec(&self) -> &'static ProjectionSpec {
        &MEDIA_OPERATIONS
    }

    fn keys(&self, event: &EventEnvelope, keys: &mut Vec<RowKey>) {
        if let Some(operation_id) = event.event.operation_id() {
            keys.push(operation_key(operation_id));
            if matches!(event.event, Event::OperationCreated(_)) || event.event.cause().is_some() {
                keys.push(counts_key(&OPERATION_COUNTS_TABLE, BY_STATUS));
            }
        }
    }

    fn apply(&self, event: &EventEnvelope, rows: &mut WorkingSet) -> Result<(), FoldError> {
        let Some(operation_id) = event.event.operation_id() else {
            return Ok(());
        };
        let fail = |reason: String| FoldError {
            seq: event.seq,
            event_type: event.event_type(),
            reason,
        };
        let key = operation_key(operation_id);

        if let Event::OperationCreated(created) = &event.event {
            if rows.get(&key).is_some() {
                return Err(fail(format!("operation {operation_id} already exists")));
            }
            if !INITIAL_STATUSES.contains(&created.status) {
                return Err(fail(format!("an operation cannot be created {}", created.status)));
            }
            rows.put(Row::Operation(OperationRow {
                operation_id,
                kind: created.kind.clone(),
                media_id: created.target.media_id,
                region_id: created.target.region_id,
                path: created.target.path.clone(),
                revision: created.revision.clone(),
                inputs: super::json_text(&created.inputs),
                status: created.status,
                stage: (created.kind == INGESTION_FILE).then_some(IngestionStage::Discovered),
                priority: i64::from(created.priority),
                attempt_count: 0,
                interruption_count: 0,
                claim_token: None,
                worker: None,
                lease_expires_at: None,
                available_at: Some(event.recorded_at),
                cancel_requested: false,
                phase: None,
                processed: None,
                total: None,
                last_error: None,
                status_reason: None,
                blocked_on: None,
                created_at: event.recorded_at,
                updated_at: event.recorded_at,
                version: event.stream_version,
            }));
            add_count(rows, &OPERATION_COUNTS_TABLE, BY_STATUS, created.status.as_str(), 1);
            return Ok(());
        }

        let Some(Row::Operation(current)) = rows.get(&key) else {
            return Err(fail(format!("operation {operation_id} does not exist")));
        };
        // Everything that can refuse the event is checked before the row
        // changes; then it changes in place (no copy of the row per event).
        let previous_status = current.status;
        let status = match event.event.cause() {
            Some(cause) => transitions::transition(current.status, cause).map_err(|error| fail(error.to_string()))?,
            None => current.status,
        };
        match &event.event {
            Event::OperationStarted(started)
                if current.claim_token.as_deref() != Some(started.claim_token.as_str()) =>
            {
                return Err(fail("start carries a claim token that does not hold the claim".into()));
            }
            Event::OperationProgressed(_) if !current.status.is_claimed() => {
                return Err(fail(format!("progress reported while {}", current.status)));
            }
            Event::OperationStageChanged(_) if current.kind != INGESTION_FILE => {
                return Err(fail(format!("{} operations have no stage", current.kind)));
            }
            Event::OperationStageChanged(changed) => {
                if let Some(stage) = current.stage.filter(|stage| changed.stage.rank() <= stage.rank()) {
                    return Err(fail(format!("stage cannot go from {stage} to {}", changed.stage)));
                }
            }
            Event::OperationCancelRequested(_) if current.status.is_terminal() => {
                return Err(fail(format!("cancel requested on a {} operation", current.status)));
            }
            _ => {}
        }
        rows.modify(&key, |row| {
            if let Row::Operation(next) = row {
                next.status = status;
                if status != OperationStatus::Blocked {
                    next.blocked_on = None;
                }
                change_operation(next, event);
                next.updated_at = event.recorded_at;
                next.version = event.stream_version;
            }
        });
        if status != previous_status {
            add_count(rows, &OPERATION_COUNTS_TABLE, BY_STATUS, previous_status.as_str(), -1);
            add_count(rows, &OPERATION_COUNTS_TABLE, BY_STATUS, status.as_str(), 1);
        }
        Ok(())
    }
}

/// What an accepted event (checked by [`MediaOperations::apply`]) changes
/// in its operation's row, besides status, time and version.
fn change_operation(next: &mut OperationRow, event: &EventEnvelope) {
    match &event.event {
        Event::OperationClaimed(claimed) => {
            next.claim_token = Some(claimed.claim_token.clone());
            next.worker = Some(claimed.worker.clone());
            next.lease_expires_at = Some(claimed.lease_expires_at);
            next.attempt_count += 1;
            next.phase = None;
            next.processed = None;
            next.total = None;
            next.status_reason = None;
        }
        Event::OperationStarted(_) => {}
        Event::OperationProgressed(progress) => {
            next.phase = Some(progress.phase.clone());
            next.processed = Some(progress.processed);
            next.total = progress.total;
        }
        Event::OperationStageChanged(changed) => {
            next.stage = Some(changed.stage);
            if let Some(inputs) = &changed.inputs {
                next.inputs = super::json_text(inputs);
            }
        }
        Event::OperationSucceeded(_) => next.clear_claim(),
        Event::OperationFailed(failed) => {
            next.clear_claim();
            next.last_error = Some(failed.error.clone());
            next.status_reason = Some(failed.error.clone());
        }
        Event::OperationRetryScheduled(retry) => {
            next.available_at = Some(retry.available_at);
        }
        Event::OperationReleased(released) => {
            // Given back unused: not an attempt.
            next.clear_claim();
            next.attempt_count = (next.attempt_count - 1).max(0);
            next.available_at = Some(event.recorded_at);
            next.status_reason = Some(released.reason.clone());
        }
        Event::OperationInterrupted(interrupted) => {
            next.clear_claim();
            next.interruption_count += 1;
            next.status_reason = Some(interrupted.reason.clone());
        }
        Event::OperationCancelRequested(request) => {
            next.cancel_requested = true;
            next.status_reason = Some(request.reason.clone());
        }
        Event::OperationRequeued(reason) | Event::OperationReopened(reason) => {
            next.available_at = Some(event.recorded_at);
            next.cancel_requested = false;
            next.status_reason = Some(reason.reason.clone());
        }
        Event::OperationQueued(reason) | Event::OperationUnblocked(reason) => {
            next.available_at = Some(event.recorded_at);
            next.status_reason = Some(reason.reason.clone());
        }
        Event::OperationBlocked(blocked) => {
            next.clear_claim();
            next.status_reason = Some(blocked.reason.clone());
            next.blocked_on = blocked.blocked_on.clone();
        }
        Event::OperationFoundNothing(reason)
        | Event::OperationMissingConfirmed(reason)
        | Event::OperationNotApplicable(reason)
        | Event::OperationSkipped(reason)
        | Event::OperationDeadLettered(reason)
        | Event::OperationCancelled(reason) => {
            next.clear_claim();
            next.status_reason = Some(reason.reason.clone());
        }
        Event::OperationRevisionRequested(requested) => {
            next.revision = Some(requested.revision.clone());
            next.inputs = super::json_text(&requested.inputs);
            if requested.requeue {
                next.available_at = Some(event.recorded_at);
                next.cancel_requested = false;
                next.status_reason = Some(format!("revision {} requested", requested.revision));
            }
        }
        Event::OperationSuperseded(superseded) => {
            next.clear_claim();
            next.available_at = Some(event.recorded_at);
            if let Some(error) = &superseded.error {
                next.last_error = Some(error.clone());
            }
            next.status_reason = Some(format!(
                "revision {} {} after revision {} was requested",
                superseded.claimed_revision, superseded.outcome, superseded.requested_revision
            ));
        }
        Event::OperationCreated(_)
        | Event::TaskVersionChanged(_)
        | Event::TaskKindDeclared(_)
        | Event::ReviewResolved(_)
        | Event::BatchCreated(_)
        | Event::BatchItemsAdded(_)
        | Event::BatchItemSettled(_)
        | Event::BatchCancelRequested(_)
        | Event::BatchResumed(_)
        | Event::MediaRegistered(_)
        | Event::MediaUpdated(_)
        | Event::MediaRemoved(_)
        | Event::RegionAdded(_)
        | Event::RegionRemoved(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::StreamId;
    use crate::events::{OperationCreated, OperationStageChanged, OperationStarted, OperationTarget};
    use uuid::Uuid;

    fn envelope(version: i64, event: Event) -> EventEnvelope {
        EventEnvelope {
            seq: version,
            stream_id: StreamId::operation(OperationId(Uuid::from_u128(7))),
            stream_version: version,
            schema_version: 1,
            recorded_at: Timestamp::from_micros(1_000_000 * version),
            actor: "test".into(),
            correlation_id: "test".into(),
            causation_id: None,
            event,
        }
    }

    /// An event the fold refuses leaves the operation's row as it was:
    /// the row is changed in place only once every check has passed.
    #[test]
    fn a_refused_event_leaves_the_operation_row_untouched() {
        let operation_id = OperationId(Uuid::from_u128(7));
        let mut rows = WorkingSet::default();
        rows.insert_loaded(operation_key(operation_id), None);
        rows.insert_loaded(counts_key(&OPERATION_COUNTS_TABLE, BY_STATUS), None);
        let created = envelope(
            1,
            Event::OperationCreated(OperationCreated {
                operation_id,
                kind: INGESTION_FILE.into(),
                target: OperationTarget {
                    media_id: None,
                    region_id: None,
                    path: Some("/a.png".into()),
                },
                revision: None,
                inputs: serde_json::json!({}),
                status: OperationStatus::Queued,
                priority: 0,
                task_version: None,
                task: None,
            }),
        );
        MediaOperations.apply(&created, &mut rows).unwrap();
        let forward = envelope(
            2,
            Event::OperationStageChanged(OperationStageChanged {
                operation_id,
                stage: IngestionStage::Hashing,
                inputs: None,
            }),
        );
        MediaOperations.apply(&forward, &mut rows).unwrap();
        let before = rows.get(&operation_key(operation_id)).cloned();
        for refused in [
            Event::OperationStageChanged(OperationStageChanged {
                operation_id,
                stage: IngestionStage::Settling,
                inputs: None,
            }),
            Event::OperationStarted(OperationStarted {
                operation_id,
                claim_token: "not-the-claim".into(),
            }),
        ] {
            let error = MediaOperations.apply(&envelope(3, refused), &mut rows).unwrap_err();
            assert_eq!(error.seq, 3, "{error:?}");
            assert_eq!(rows.get(&operation_key(operation_id)).cloned(), before);
        }
        let Some(Row::Operation(row)) = before else {
            panic!("no operation row")
        };
        assert_eq!((row.stage, row.version), (Some(IngestionStage::Hashing), 2));
    }
}
