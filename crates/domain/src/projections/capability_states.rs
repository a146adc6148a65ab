//! `entity_capability_states`: per media item and capability, whether the
//! item can serve it now, and if not, why — plus the task version that
//! produced what it has.
//!
//! A capability is produced by one task kind, and a task kind has one task
//! operation per item for the item's whole life, so each row follows one
//! task operation (its primary key) and is unique per `(media_id,
//! capability)`. The row's status is read off the processing state the same
//! event just produced (this projection folds after `processing_states` and
//! is always rebuilt with it), and is `stale` when the result on hand was
//! produced by a version the engine has since recorded as no longer current
//! (`task_version_changed`). The fold never consults the registry's versions:
//! replay under a newer build must reproduce exactly what was recorded.
//!
//! Beside the rows it keeps `entity_capability_counts`: one row
//! (`by_status`) counting capabilities by status, changed with every status
//! change, so the dashboard reads one row whatever the number of items. A
//! removed media item's capabilities vanish by cascade; the fold loads them
//! by query first and subtracts them.

use super::cells::{text_or_null, Cell, CellReader, ColumnSpec, ColumnType, MapError, TableSpec};
use super::counts::{add_count, counts_key, CAPABILITY_COUNTS_TABLE, STALE_BY_KIND};
use super::working_set::{RowKey, RowQuery, WorkingSet};
use super::{media_key, state_key, ProjectionSpec, Projector, Row, BY_STATUS};
use crate::capabilities::capability_status;
use crate::envelope::EventEnvelope;
use crate::error::FoldError;
use crate::events::Event;
use crate::ids::{MediaId, OperationId};
use crate::kinds::KindChange;
use crate::status::{CapabilityStatus, OperationStatus};
use crate::tasks::TargetType;
use crate::time::Timestamp;

pub static CAPABILITY_STATES_TABLE: TableSpec = TableSpec {
    name: "entity_capability_states",
    columns: &[
        ColumnSpec::required("operation_id", ColumnType::Uuid),
        ColumnSpec::required("media_id", ColumnType::Uuid),
        ColumnSpec::required("capability", ColumnType::Text),
        ColumnSpec::required("task_kind", ColumnType::Text),
        ColumnSpec::required("status", ColumnType::Text),
        ColumnSpec::required("required", ColumnType::Bool),
        ColumnSpec::optional("requested_version", ColumnType::Text),
        ColumnSpec::optional("claimed_version", ColumnType::Text),
        ColumnSpec::optional("produced_version", ColumnType::Text),
        ColumnSpec::optional("current_version", ColumnType::Text),
        ColumnSpec::required("version_key", ColumnType::Text),
        ColumnSpec::optional("produced_revision", ColumnType::Text),
        ColumnSpec::optional("reason", ColumnType::Text),
        ColumnSpec::required("updated_at", ColumnType::Timestamp),
        ColumnSpec::required("version", ColumnType::Integer),
    ],
    key_columns: 1,
};

pub static CAPABILITY_STATES: ProjectionSpec = ProjectionSpec {
    name: "entity_capability_states",
    version: 4,
    tables: &[&CAPABILITY_STATES_TABLE, &CAPABILITY_COUNTS_TABLE],
    question: "For each media item and capability: can the item serve it now, and if not, why; and which task version produced what it has?",
    depends_on: &["media_registry", "processing_states"],
};

#[derive(Debug, Clone, PartialEq)]
pub struct CapabilityRow {
    /// The task operation producing the capability (the primary key).
    pub operation_id: OperationId,
    pub media_id: MediaId,
    pub capability: String,
    pub task_kind: String,
    pub status: CapabilityStatus,
    pub required: bool,
    /// The task version of the requested revision.
    pub requested_version: Option<String>,
    /// The task version the current claim runs (None when unclaimed).
    pub claimed_version: Option<String>,
    /// The task version that produced the result on hand.
    pub produced_version: Option<String>,
    /// The version last known to be current: the requested one, or the one
    /// the engine recorded when it found the registry changed.
    pub current_version: Option<String>,
    pub produced_revision: Option<String>,
    /// Why the capability is as it is (the task's last reason or error).
    pub reason: Option<String>,
    pub updated_at: Timestamp,
    /// The operation stream's version after the last event folded in.
    pub version: i64,
}

impl CapabilityRow {
    pub fn to_cells(&self) -> Vec<Cell> {
        vec![
            Cell::Uuid(self.operation_id.0),
            Cell::Uuid(self.media_id.0),
            Cell::Text(self.capability.clone()),
            Cell::Text(self.task_kind.clone()),
            Cell::Text(self.status.as_str().to_string()),
            Cell::Bool(self.required),
            text_or_null(&self.requested_version),
            text_or_null(&self.claimed_version),
            text_or_null(&self.produced_version),
            text_or_null(&self.current_version),
            Cell::Text(self.version_key()),
            text_or_null(&self.produced_revision),
            text_or_null(&self.reason),
            Cell::Timestamp(self.updated_at),
            Cell::Integer(self.version),
        ]
    }

    pub fn from_cells(cells: Vec<Cell>) -> Result<Self, MapError> {
        let mut reader = CellReader::new(&CAPABILITY_STATES_TABLE, cells);
        Ok(CapabilityRow {
            operation_id: OperationId(reader.uuid()?),
            media_id: MediaId(reader.uuid()?),
            capability: reader.text()?,
            task_kind: reader.text()?,
            status: reader.parsed()?,
            required: reader.boolean()?,
            requested_version: reader.optional_text()?,
            claimed_version: reader.optional_text()?,
            produced_version: reader.optional_text()?,
            current_version: reader.optional_text()?,
            produced_revision: {
                // `version_key` is derived from task_kind and current_version.
                let _version_key = reader.text()?;
                reader.optional_text()?
            },
            reason: reader.optional_text()?,
            updated_at: reader.timestamp()?,
            version: reader.integer()?,
        })
    }

    /// `task_kind@current_version`: what the engine's version sweep counts
    /// by (one grouped count finds the kinds with rows requested at another
    /// version than the current one).
    pub fn version_key(&self) -> String {
        version_key(&self.task_kind, self.current_version.as_deref())
    }

    /// Whether the result on hand was produced by a version that is no
    /// longer current.
    pub fn is_stale(&self) -> bool {
        self.produced_version.is_some()
            && self.current_version.is_some()
            && self.produced_version != self.current_version
    }
}

/// The `version_key` of a kind at a version (`?` for an unknown version).
pub fn version_key(task_kind: &str, version: Option<&str>) -> String {
    format!("{task_kind}@{}", version.unwrap_or("?"))
}

pub fn capability_key(operation_id: OperationId) -> RowKey {
    RowKey::new(&CAPABILITY_STATES_TABLE, operation_id.key())
}

/// Folds media task operations into capability states.
pub struct CapabilityStates;

impl Projector for CapabilityStates {
    fn spec(&self) -> &'static ProjectionSpec {
        &CAPABILITY_STATES
    }

    fn keys(&self, event: &EventEnvelope, keys: &mut Vec<RowKey>) {
        if let Event::OperationCreated(created) = &event.event {
            if created.task.as_ref().is_some_and(|facts| facts.capability.is_some()) {
                keys.push(capability_key(created.operation_id));
                keys.push(state_key(TargetType::Media, created.operation_id));
                keys.extend(created.target.media_id.map(media_key));
                keys.push(counts_key(&CAPABILITY_COUNTS_TABLE, BY_STATUS));
            }
            return;
        }
        if let Event::MediaRemoved(_) = &event.event {
            keys.push(counts_key(&CAPABILITY_COUNTS_TABLE, BY_STATUS));
            keys.push(counts_key(&CAPABILITY_COUNTS_TABLE, STALE_BY_KIND));
            return;
        }
        if let Some(operation_id) = event.event.operation_id() {
            keys.push(capability_key(operation_id));
            keys.push(state_key(TargetType::Media, operation_id));
            keys.push(counts_key(&CAPABILITY_COUNTS_TABLE, BY_STATUS));
            keys.push(counts_key(&CAPABILITY_COUNTS_TABLE, STALE_BY_KIND));
        }
    }

    fn queries(&self, event: &EventEnvelope, queries: &mut Vec<RowQuery>) {
        // A kind's `required` changed: every capability it produces follows.
        if let Event::TaskKindDeclared(declared) = &event.event {
            if declared.change == KindChange::Policy {
                queries.push(RowQuery {
                    table: &CAPABILITY_STATES_TABLE,
                    column: "task_kind",
                    value: Cell::Text(declared.declaration.name.clone()),
                });
            }
        }
        if let Event::MediaRemoved(removed) = &event.event {
            queries.push(RowQuery {
                table: &CAPABILITY_STATES_TABLE,
                column: "media_id",
                value: Cell::Uuid(removed.media_id.0),
            });
        }
    }

    fn apply(&self, event: &EventEnvelope, rows: &mut WorkingSet) -> Result<(), FoldError> {
        if let Event::TaskKindDeclared(declared) = &event.event {
            let declaration = &declared.declaration;
            if declared.change == KindChange::Policy {
                let changed: Vec<CapabilityRow> = rows
                    .rows()
                    .filter_map(|row| match row {
                        Row::Capability(row)
                            if row.task_kind == declaration.name && row.required != declaration.required =>
                        {
                            Some(row.clone())
                        }
                        _ => None,
                    })
                    .collect();
                for mut row in changed {
                    row.required = declaration.required;
                    rows.put(Row::Capability(row));
                }
            }
            return Ok(());
        }
        if let Event::MediaRemoved(removed) = &event.event {
            // The registry (folded first) deleted the item; its
            // capabilities went by cascade and leave the counts.
            for row in rows.take_removed_with(&media_key(removed.media_id), &CAPABILITY_STATES_TABLE) {
                if let Row::Capability(row) = row {
                    add_count(rows, &CAPABILITY_COUNTS_TABLE, BY_STATUS, row.status.as_str(), -1);
                    if row.status == CapabilityStatus::Stale {
                        add_count(rows, &CAPABILITY_COUNTS_TABLE, STALE_BY_KIND, &row.task_kind, -1);
                    }
                }
            }
            return Ok(());
        }
        let Some(operation_id) = event.event.operation_id() else {
            return Ok(());
        };
        let fail = |reason: String| FoldError {
            seq: event.seq,
            event_type: event.event_type(),
            reason,
        };
        // The processing state this event just produced (processing_states
        // folds first). No state: not a media task, or its item is gone.
        let state = match rows.get(&state_key(TargetType::Media, operation_id)) {
            Some(Row::ProcessingState(state)) => state.clone(),
            _ => return Ok(()),
        };
        let key = capability_key(operation_id);
        let before = match rows.get(&key) {
            Some(Row::Capability(row)) => Some(row.status),
            _ => None,
        };
        let mut next = match (&event.event, rows.get(&key)) {
            (Event::OperationCreated(created), existing) => {
                let Some((capability, required)) = created
                    .task
                    .as_ref()
                    .and_then(|facts| facts.capability.clone().map(|capability| (capability, facts.required)))
                else {
                    return Ok(());
                };
                if existing.is_some() {
                    return Err(fail(format!("capability of operation {operation_id} already exists")));
                }
                let Some(media_id) = created.target.media_id else {
                    return Err(fail(format!("a {} task needs a media target", created.kind)));
                };
                CapabilityRow {
                    operation_id,
                    media_id,
                    capability,
                    task_kind: created.kind.clone(),
                    status: CapabilityStatus::Pending,
                    required,
                    requested_version: created.task_version.clone(),
                    claimed_version: None,
                    produced_version: None,
                    current_version: created.task_version.clone(),
                    produced_revision: None,
                    reason: None,
                    updated_at: event.recorded_at,
                    version: event.stream_version,
                }
            }
            (_, Some(Row::Capability(row))) => row.clone(),
            // A media task created before this projection knew its kind
            // has no capability; nothing to fold.
            _ => return Ok(()),
        };
        match &event.event {
            Event::OperationRevisionRequested(requested) => {
                next.requested_version = requested.task_version.clone();
                next.current_version = requested.task_version.clone();
            }
            Event::OperationClaimed(_) => {
                next.claimed_version = next.requested_version.clone();
            }
            Event::OperationSucceeded(_) | Event::OperationFoundNothing(_)
                if next.claimed_version.is_some() || state.completed_revision.is_some() =>
            {
                next.produced_version = next.claimed_version.take();
                next.produced_revision = state.completed_revision.clone();
            }
            Event::OperationSuperseded(superseded) => {
                let produced = next.claimed_version.take();
                if matches!(superseded.outcome.as_str(), "succeeded" | "no_result") {
                    next.produced_version = produced;
                    next.produced_revision = Some(superseded.claimed_revision.clone());
                }
            }
            Event::TaskVersionChanged(changed) => {
                next.current_version = Some(changed.current_version.clone());
            }
            _ => {}
        }
        if !state.status.is_claimed() {
            next.claimed_version = None;
        }
        let stale = matches!(state.status, OperationStatus::Succeeded | OperationStatus::NoResult) && next.is_stale();
        next.status = capability_status(state.status, stale);
        next.reason = if stale {
            Some(format!(
                "produced by version {} of {}; version {} is current",
                next.produced_version.as_deref().unwrap_or("?"),
                next.task_kind,
                next.current_version.as_deref().unwrap_or("?")
            ))
        } else {
            state.last_error.clone().or_else(|| state.status_reason.clone())
        };
        next.updated_at = event.recorded_at;
        next.version = event.stream_version;
        if before != Some(next.status) {
            if let Some(before) = before {
                add_count(rows, &CAPABILITY_COUNTS_TABLE, BY_STATUS, before.as_str(), -1);
            }
            add_count(rows, &CAPABILITY_COUNTS_TABLE, BY_STATUS, next.status.as_str(), 1);
            // What `reprocess --stale` would run, per kind.
            if before == Some(CapabilityStatus::Stale) {
                add_count(rows, &CAPABILITY_COUNTS_TABLE, STALE_BY_KIND, &next.task_kind, -1);
            }
            if next.status == CapabilityStatus::Stale {
                add_count(rows, &CAPABILITY_COUNTS_TABLE, STALE_BY_KIND, &next.task_kind, 1);
            }
        }
        rows.put(Row::Capability(next));
        Ok(())
    }
}
