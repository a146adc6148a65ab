//! `media_processing_states` and `region_processing_states`: the current
//! state of one task kind on one target — what revision is wanted, what
//! revision was last completed, who holds the claim, when it may run next,
//! and why it last failed.
//!
//! Each row belongs to one task operation (one per target and task kind,
//! for the item's whole life; new revisions are events on the same
//! operation), so the operation's events find their row by operation id.
//! The rows hang on the media registry by real foreign keys with cascade:
//! the projection depends on `media_registry` and is always rebuilt with it.
//!
//! Heartbeats are liveness, not history: the extended lease and the progress
//! counters live in the store's lease table, keyed by claim token, which
//! replay does not rebuild. `lease_expires_at` here is the lease the claim
//! event granted.

use super::cells::{text_or_null, timestamp_or_null, Cell, CellReader, ColumnSpec, ColumnType, MapError, TableSpec};
use super::working_set::{RowKey, WorkingSet};
use super::{media_key, region_key, ProjectionSpec, Projector, Row};
use crate::envelope::EventEnvelope;
use crate::error::FoldError;
use crate::events::Event;
use crate::ids::{MediaId, OperationId, RegionId};
use crate::status::OperationStatus;
use crate::tasks::TargetType;
use crate::time::Timestamp;
use crate::transitions::{self, INITIAL_STATUSES};
use uuid::Uuid;

macro_rules! state_columns {
    ($target:literal) => {
        &[
            ColumnSpec::required("operation_id", ColumnType::Uuid),
            ColumnSpec::required($target, ColumnType::Uuid),
            ColumnSpec::required("task_kind", ColumnType::Text),
            ColumnSpec::required("status", ColumnType::Text),
            ColumnSpec::required("priority", ColumnType::Integer),
            ColumnSpec::required("requested_revision", ColumnType::Text),
            ColumnSpec::required("inputs", ColumnType::Json),
            ColumnSpec::optional("task_version", ColumnType::Text),
            ColumnSpec::optional("claimed_revision", ColumnType::Text),
            ColumnSpec::optional("completed_revision", ColumnType::Text),
            ColumnSpec::optional("output", ColumnType::Json),
            ColumnSpec::optional("claim_token", ColumnType::Text),
            ColumnSpec::optional("worker", ColumnType::Text),
            ColumnSpec::optional("claimed_at", ColumnType::Timestamp),
            ColumnSpec::optional("lease_expires_at", ColumnType::Timestamp),
            ColumnSpec::required("attempt_count", ColumnType::Integer),
            ColumnSpec::required("failure_count", ColumnType::Integer),
            ColumnSpec::required("interruption_count", ColumnType::Integer),
            ColumnSpec::required("available_at", ColumnType::Timestamp),
            ColumnSpec::required("cancel_requested", ColumnType::Bool),
            ColumnSpec::optional("last_error", ColumnType::Text),
            ColumnSpec::optional("status_reason", ColumnType::Text),
            ColumnSpec::required("updated_at", ColumnType::Timestamp),
            ColumnSpec::required("version", ColumnType::Integer),
        ]
    };
}

pub static MEDIA_STATES_TABLE: TableSpec = TableSpec {
    name: "media_processing_states",
    columns: state_columns!("media_id"),
    key_columns: 1,
};

pub static REGION_STATES_TABLE: TableSpec = TableSpec {
    name: "region_processing_states",
    columns: state_columns!("region_id"),
    key_columns: 1,
};

pub static PROCESSING_STATES: ProjectionSpec = ProjectionSpec {
    name: "processing_states",
    version: 5,
    tables: &[&MEDIA_STATES_TABLE, &REGION_STATES_TABLE],
    question: "For each item (or region) and task kind: which revision is wanted, which is done, who holds it, when may it run next, and why did it last fail?",
    depends_on: &["media_registry", "task_kinds"],
};

/// The state of one task kind on one target.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessingStateRow {
    /// The task operation this row follows (the primary key).
    pub operation_id: OperationId,
    pub target_type: TargetType,
    /// The media item or region id, by `target_type`.
    pub target_id: Uuid,
    pub task_kind: String,
    pub status: OperationStatus,
    pub priority: i64,
    pub requested_revision: String,
    /// JSON text of the requested revision's complete inputs.
    pub inputs: String,
    /// The version of the task kind the requested revision was computed
    /// with: what a claim offers only to workers that state it. `None` for
    /// a task recorded before versions were (its version is unknown).
    pub task_version: Option<String>,
    /// The revision the current claim runs (None when unclaimed).
    pub claimed_revision: Option<String>,
    /// The last revision a worker finished with a result.
    pub completed_revision: Option<String>,
    /// JSON text of the output recorded with `completed_revision`.
    pub output: Option<String>,
    pub claim_token: Option<String>,
    pub worker: Option<String>,
    pub claimed_at: Option<Timestamp>,
    /// The lease the claim granted; heartbeats extend it in the lease table.
    pub lease_expires_at: Option<Timestamp>,
    /// Claims taken for the requested revision.
    pub attempt_count: i64,
    /// Claims that ended in an application error, for this revision.
    pub failure_count: i64,
    /// Claims lost to crashes or expired leases, for this revision.
    pub interruption_count: i64,
    pub available_at: Timestamp,
    pub cancel_requested: bool,
    pub last_error: Option<String>,
    pub status_reason: Option<String>,
    pub updated_at: Timestamp,
    /// The operation stream's version after the last event folded in.
    pub version: i64,
}

impl ProcessingStateRow {
    pub fn table(&self) -> &'static TableSpec {
        state_table(self.target_type)
    }

    pub fn media_id(&self) -> Option<MediaId> {
        (self.target_type == TargetType::Media).then_some(MediaId(self.target_id))
    }

    pub fn region_id(&self) -> Option<RegionId> {
        (self.target_type == TargetType::Region).then_some(RegionId(self.target_id))
    }

    pub fn to_cells(&self) -> Vec<Cell> {
        vec![
            Cell::Uuid(self.operation_id.0),
            Cell::Uuid(self.target_id),
            Cell::Text(self.task_kind.clone()),
            Cell::Text(self.status.as_str().to_string()),
            Cell::Integer(self.priority),
            Cell::Text(self.requested_revision.clone()),
            Cell::Json(self.inputs.clone()),
            text_or_null(&self.task_version),
            text_or_null(&self.claimed_revision),
            text_or_null(&self.completed_revision),
            self.output.clone().map_or(Cell::Null, Cell::Json),
            text_or_null(&self.claim_token),
            text_or_null(&self.worker),
            timestamp_or_null(self.claimed_at),
            timestamp_or_null(self.lease_expires_at),
            Cell::Integer(self.attempt_count),
            Cell::Integer(self.failure_count),
            Cell::Integer(self.interruption_count),
            Cell::Timestamp(self.available_at),
            Cell::Bool(self.cancel_requested),
            text_or_null(&self.last_error),
            text_or_null(&self.status_reason),
            Cell::Timestamp(self.updated_at),
            Cell::Integer(self.version),
        ]
    }

    pub fn from_cells(target_type: TargetType, cells: Vec<Cell>) -> Result<Self, MapError> {
        let mut reader = CellReader::new(state_table(target_type), cells);
        Ok(ProcessingStateRow {
            operation_id: OperationId(reader.uuid()?),
            target_type,
            target_id: reader.uuid()?,
            task_kind: reader.text()?,
            status: reader.parsed()?,
            priority: reader.integer()?,
            requested_revision: reader.text()?,
            inputs: reader.text()?,
            task_version: reader.optional_text()?,
            claimed_revision: reader.optional_text()?,
            completed_revision: reader.optional_text()?,
            output: reader.optional_text()?,
            claim_token: reader.optional_text()?,
            worker: reader.optional_text()?,
            claimed_at: reader.optional_timestamp()?,
            lease_expires_at: reader.optional_timestamp()?,
            attempt_count: reader.integer()?,
            failure_count: reader.integer()?,
            interruption_count: reader.integer()?,
            available_at: reader.timestamp()?,
            cancel_requested: reader.boolean()?,
            last_error: reader.optional_text()?,
            status_reason: reader.optional_text()?,
            updated_at: reader.timestamp()?,
            version: reader.integer()?,
        })
    }

    fn clear_claim(&mut self) {
        self.claimed_revision = None;
        self.claim_token = None;
        self.worker = None;
        self.claimed_at = None;
        self.lease_expires_at = None;
    }

    /// The row key of the parent whose deletion cascades into this row.
    pub fn parent_key(&self) -> RowKey {
        match self.target_type {
            TargetType::Media => media_key(MediaId(self.target_id)),
            TargetType::Region => region_key(RegionId(self.target_id)),
        }
    }
}

/// The processing-state table of a target type.
pub fn state_table(target_type: TargetType) -> &'static TableSpec {
    match target_type {
        TargetType::Media => &MEDIA_STATES_TABLE,
        TargetType::Region => &REGION_STATES_TABLE,
    }
}

pub fn state_key(target_type: TargetType, operation_id: OperationId) -> RowKey {
    RowKey::new(state_table(target_type), operation_id.key())
}

/// Where the processing state of a task operation known only by its id may
/// be: each state table with the operation's key in it, media first. The
/// row is in exactly one of them, the one of its target's type.
pub fn state_locations(operation_id: OperationId) -> [(&'static TableSpec, RowKey); 2] {
    [TargetType::Media, TargetType::Region]
        .map(|target_type| (state_table(target_type), state_key(target_type, operation_id)))
}

/// Folds task operations' events into the processing-state tables.
pub struct ProcessingStates;

impl Projector for ProcessingStates {
    fn spec(&self) -> &'static ProjectionSpec {
        &PROCESSING_STATES
    }

    fn keys(&self, event: &EventEnvelope, keys: &mut Vec<RowKey>) {
        if let Event::OperationCreated(created) = &event.event {
            // Only task kinds have a processing state; the parent is read to
            // refuse a state for a target that does not exist (the foreign key,
            // checked in memory too).
            if let Some(facts) = &created.task {
                keys.push(state_key(facts.target, created.operation_id));
                match facts.target {
                    TargetType::Media => keys.extend(created.target.media_id.map(media_key)),
                    TargetType::Region => keys.extend(created.target.region_id.map(region_key)),
                }
            }
            return;
        }
        if let Some(operation_id) = event.event.operation_id() {
            keys.push(state_key(TargetType::Media, operation_id));
            keys.push(state_key(TargetType::Region, operation_id));
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

        if let Event::OperationCreated(created) = &event.event {
            let Some(facts) = &created.task else {
                return Ok(());
            };
            let kind = &created.kind;
            let (target_id, parent) = match facts.target {
                TargetType::Media => (
                    created.target.media_id.map(|id| id.0),
                    created.target.media_id.map(media_key),
                ),
                TargetType::Region => (
                    created.target.region_id.map(|id| id.0),
                    created.target.region_id.map(region_key),
                ),
            };
            let (Some(target_id), Some(parent)) = (target_id, parent) else {
                return Err(fail(format!("a {kind} task needs a {} target", facts.target)));
            };
            if rows.get(&parent).is_none() {
                return Err(fail(format!("{} {target_id} does not exist", facts.target)));
            }
            let Some(revision) = created.revision.clone() else {
                return Err(fail(format!("a {kind} task needs a revision")));
            };
            if !INITIAL_STATUSES.contains(&created.status) {
                return Err(fail(format!("a task cannot be created {}", created.status)));
            }
            let key = state_key(facts.target, operation_id);
            if rows.get(&key).is_some() {
                return Err(fail(format!("task operation {operation_id} already exists")));
            }
            rows.put(Row::ProcessingState(ProcessingStateRow {
                operation_id,
                target_type: facts.target,
                target_id,
                task_kind: kind.clone(),
                status: created.status,
                priority: i64::from(created.priority),
                requested_revision: revision,
                inputs: super::json_text(&created.inputs),
                task_version: created.task_version.clone(),
                claimed_revision: None,
                completed_revision: None,
                output: None,
                claim_token: None,
                worker: None,
                claimed_at: None,
                lease_expires_at: None,
                attempt_count: 0,
                failure_count: 0,
                interruption_count: 0,
                available_at: event.recorded_at,
                cancel_requested: false,
                last_error: None,
                status_reason: None,
                updated_at: event.recorded_at,
                version: event.stream_version,
            }));
            return Ok(());
        }

        // Operations that are not tasks have no row; neither has a task whose
        // target was removed (the row went with it by cascade). Either way
        // there is nothing to fold.
        let current = match (
            rows.get(&state_key(TargetType::Media, operation_id)),
            rows.get(&state_key(TargetType::Region, operation_id)),
        ) {
            (Some(Row::ProcessingState(row)), _) | (_, Some(Row::ProcessingState(row))) => row.clone(),
            _ => return Ok(()),
        };
        let mut next = current.clone();
        if let Some(cause) = event.event.cause() {
            next.status = transitions::transition(current.status, cause).map_err(|error| fail(error.to_string()))?;
        }
        match &event.event {
            Event::OperationRevisionRequested(requested) => {
                next.requested_revision = requested.revision.clone();
                next.inputs = super::json_text(&requested.inputs);
                next.task_version = requested.task_version.clone();
                // A new revision is new work: it gets its own budgets. A claim
                // running exactly that revision (the request went back to the
                // revision a worker holds) is its first attempt.
                let running_it = current.claimed_revision.as_deref() == Some(requested.revision.as_str());
                next.attempt_count = i64::from(running_it);
                next.failure_count = 0;
                next.interruption_count = 0;
                if requested.requeue {
                    next.available_at = event.recorded_at;
                    next.cancel_requested = false;
                    next.last_error = None;
                    next.status_reason = Some(format!("revision {} requested", requested.revision));
                }
                if let Some(reason) = &requested.reason {
                    next.status_reason = Some(format!(
                        "{reason}: requested again at version {} of {}",
                        requested.task_version.as_deref().unwrap_or("?"),
                        current.task_kind
                    ));
                }
            }
            Event::OperationClaimed(claimed) => {
                let Some(revision) = claimed.revision.clone() else {
                    return Err(fail("a task claim must name the revision it claims".into()));
                };
                if revision != current.requested_revision {
                    return Err(fail(format!(
                        "claim of revision {revision} but {} is requested",
                        current.requested_revision
                    )));
                }
                next.claimed_revision = Some(revision);
                next.claim_token = Some(claimed.claim_token.clone());
                next.worker = Some(claimed.worker.clone());
                next.claimed_at = Some(event.recorded_at);
                next.lease_expires_at = Some(claimed.lease_expires_at);
                next.attempt_count += 1;
                next.status_reason = None;
            }
            Event::OperationStarted(started) => {
                if current.claim_token.as_deref() != Some(started.claim_token.as_str()) {
                    return Err(fail("start carries a claim token that does not hold the claim".into()));
                }
            }
            Event::OperationSucceeded(succeeded) => {
                check_token(&current, succeeded.claim_token.as_deref()).map_err(fail)?;
                next.completed_revision = current.claimed_revision.clone();
                next.output = Some(super::json_text(&succeeded.output));
                next.last_error = None;
                next.status_reason = None;
                next.clear_claim();
            }
            Event::OperationFoundNothing(reason) => {
                if current.claimed_revision.is_some() {
                    next.completed_revision = current.claimed_revision.clone();
                    next.output = None;
                }
                next.status_reason = Some(reason.reason.clone());
                next.clear_claim();
            }
            Event::OperationSuperseded(superseded) => {
                check_token(&current, Some(&superseded.claim_token)).map_err(fail)?;
                match superseded.outcome.as_str() {
                    "succeeded" => {
                        next.completed_revision = Some(superseded.claimed_revision.clone());
                        next.output = Some(super::json_text(&superseded.output));
                    }
                    // Like a plain no-result: completed, with no output.
                    "no_result" => {
                        next.completed_revision = Some(superseded.claimed_revision.clone());
                        next.output = None;
                    }
                    _ => {}
                }
                next.available_at = event.recorded_at;
                next.status_reason = Some(format!(
                    "revision {} {} after revision {} was requested",
                    superseded.claimed_revision, superseded.outcome, superseded.requested_revision
                ));
                next.clear_claim();
            }
            Event::OperationReleased(released) => {
                check_token(&current, Some(&released.claim_token)).map_err(fail)?;
                // The claim is given back unused: the attempt it counted (a
                // claim of the requested revision) is given back with it.
                if current.claimed_revision.as_deref() == Some(current.requested_revision.as_str()) {
                    next.attempt_count = (next.attempt_count - 1).max(0);
                }
                next.available_at = event.recorded_at;
                next.status_reason = Some(released.reason.clone());
                next.clear_claim();
            }
            Event::OperationFailed(failed) => {
                // Only a worker's report is an application error; recovery's
                // quarantine of an interrupted item is not the item's fault.
                if current.status.is_claimed() {
                    check_token(&current, failed.claim_token.as_deref()).map_err(fail)?;
                    next.failure_count += 1;
                    next.last_error = Some(failed.error.clone());
                }
                next.status_reason = Some(failed.error.clone());
                next.clear_claim();
            }
            Event::OperationRetryScheduled(retry) => {
                next.available_at = retry.available_at;
            }
            Event::OperationInterrupted(interrupted) => {
                // Counted against the revision the claim ran: a claim of a
                // revision superseded meanwhile was no attempt at the requested
                // one (whose counters the request reset).
                if current.claimed_revision.as_deref() == Some(current.requested_revision.as_str()) {
                    next.interruption_count += 1;
                }
                next.status_reason = Some(interrupted.reason.clone());
                next.clear_claim();
            }
            Event::OperationCancelRequested(request) => {
                if current.status.is_terminal() {
                    return Err(fail(format!("cancel requested on a {} task", current.status)));
                }
                next.cancel_requested = true;
                next.status_reason = Some(request.reason.clone());
            }
            Event::OperationCancelled(reason) => {
                next.cancel_requested = false;
                next.status_reason = Some(reason.reason.clone());
                next.clear_claim();
            }
            Event::OperationReopened(reason) => {
                // A recorded action (a retry from the review queue, a batch
                // resume) gives the work a fresh budget: counting the old
                // failures would fail it again at its first error.
                next.failure_count = 0;
                next.interruption_count = 0;
                next.available_at = event.recorded_at;
                next.cancel_requested = false;
                next.status_reason = Some(reason.reason.clone());
            }
            Event::OperationRequeued(reason) => {
                next.available_at = event.recorded_at;
                next.cancel_requested = false;
                next.status_reason = Some(reason.reason.clone());
            }
            Event::OperationQueued(reason) | Event::OperationUnblocked(reason) => {
                next.available_at = event.recorded_at;
                next.status_reason = Some(reason.reason.clone());
            }
            Event::OperationBlocked(blocked) => {
                next.status_reason = Some(blocked.reason.clone());
                next.clear_claim();
            }
            Event::OperationMissingConfirmed(reason)
            | Event::OperationNotApplicable(reason)
            | Event::OperationSkipped(reason)
            | Event::OperationDeadLettered(reason) => {
                next.status_reason = Some(reason.reason.clone());
                next.clear_claim();
            }
            Event::OperationProgressed(_) | Event::OperationStageChanged(_) => {}
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
        // A settled task has no cancel pending: whatever was asked is over.
        if next.status.is_terminal() {
            next.cancel_requested = false;
        }
        next.updated_at = event.recorded_at;
        next.version = event.stream_version;
        rows.put(Row::ProcessingState(next));
        Ok(())
    }
}

/// An outcome event must carry the token of the claim it ends.
fn check_token(current: &ProcessingStateRow, claim_token: Option<&str>) -> Result<(), String> {
    if current.claim_token.as_deref() == claim_token {
        Ok(())
    } else {
        Err(format!(
            "outcome carries claim token {claim_token:?} but the claim is {:?}",
            current.claim_token
        ))
    }
}
