//! The work protocol: request, claim, heartbeat, progress, report (complete,
//! fail, acknowledge a cancel), cancel and recovery, each one write
//! transaction; and the reads of a task's state.
//!
//! Every command loads the processing state it decides on inside the write
//! transaction, asks the domain (`opledger_domain::work`, `requests` for
//! requests, `recovery` for claims found dead), and appends what the
//! domain returned ([`Engine::command`]), so the state a command decided
//! on is the state it changed. Reports from workers are fenced: the domain's
//! decision refuses a claim token (and revision, when given) that no longer
//! holds the task, and nothing is written. Heartbeats and progress counters
//! change only the lease table (liveness); phase changes, final counts and
//! every status change are events.
//!
//! One room per step of a task's life: `request` (asking for work),
//! `claim` (taking it and holding it: heartbeats, progress, standing),
//! `report` (how a claim ended), `cancel`, `recover` (claims whose workers
//! died) and `read` (queries). This module holds what they share: the
//! target and answer types, and the loaders of processing states.

mod cancel;
mod claim;
mod read;
mod recover;
mod report;
mod request;

pub(crate) use cancel::cancel_tasks_of_removed_target;
pub use claim::{ClaimRequest, HeartbeatOutcome, Progress, TaskClaim, MAX_CLAIM_BATCH};
pub use read::TaskView;
pub use recover::{RecoveryHook, RecoveryReport, RunningWhenGone};
pub use report::OutcomeReport;
pub(crate) use request::request_in_tx;
pub use request::{RequestOutcome, TaskRequest};

use crate::error::EngineError;
use opledger_domain::projections::{state_locations, ProcessingStateRow, Row, RowKey, TableSpec, WorkingSet};
pub use opledger_domain::requests::TaskTarget;
use opledger_domain::work::Fence;
use opledger_domain::{NewEvent, OperationId, OperationStatus, StreamId, Timestamp};
use opledger_store::{ExpectedVersion, Lease, StreamAppend, WriteTx};

/// Where a task stands after a worker's report or a cancel.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TaskOutcome {
    pub operation_id: OperationId,
    pub status: OperationStatus,
    pub requested_revision: String,
    pub completed_revision: Option<String>,
    pub available_at: Timestamp,
    pub attempt_count: i64,
    pub failure_count: i64,
    pub cancel_requested: bool,
    pub last_error: Option<String>,
}

impl TaskOutcome {
    fn of(row: &ProcessingStateRow) -> Self {
        TaskOutcome {
            operation_id: row.operation_id,
            status: row.status,
            requested_revision: row.requested_revision.clone(),
            completed_revision: row.completed_revision.clone(),
            available_at: row.available_at,
            attempt_count: row.attempt_count,
            failure_count: row.failure_count,
            cancel_requested: row.cancel_requested,
            last_error: row.last_error.clone(),
        }
    }

    /// Where the task stands in `rows` (after a command's appends folded);
    /// NotFound when they hold no state of it.
    fn in_rows(rows: &WorkingSet, operation_id: OperationId) -> Result<Self, EngineError> {
        state_in(rows, operation_id)
            .map(|state| TaskOutcome::of(&state))
            .ok_or_else(|| EngineError::not_found("task", operation_id))
    }
}

fn stale_claim(fence: &Fence) -> EngineError {
    EngineError::Domain(opledger_domain::DomainError::Conflict(format!(
        "claim {} does not hold any task (it finished, was interrupted by recovery, or never existed)",
        fence.claim_token
    )))
}

/// The processing state of a task operation as `rows` hold it, whichever
/// table it is in.
pub(crate) fn state_in(rows: &WorkingSet, operation_id: OperationId) -> Option<ProcessingStateRow> {
    state_locations(operation_id)
        .iter()
        .find_map(|(_, key)| match rows.get(key) {
            Some(Row::ProcessingState(row)) => Some(row.clone()),
            _ => None,
        })
}

/// Loads the processing states of many task operations (both tables) into
/// `rows`, absent ones as known-absent, skipping keys `rows` already knows.
async fn load_states<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    operation_ids: &[OperationId],
) -> Result<(), EngineError> {
    // One read per table, media first.
    let mut unknown: Vec<(&'static TableSpec, Vec<String>)> = Vec::new();
    for (table, key) in operation_ids.iter().flat_map(|id| state_locations(*id)) {
        if rows.is_known(&key) {
            continue;
        }
        match unknown.iter_mut().find(|(known, _)| known.name == table.name) {
            Some((_, keys)) => keys.push(key.key.to_string()),
            None => unknown.push((table, vec![key.key.to_string()])),
        }
    }
    for (table, keys) in unknown {
        let loaded = tx.load_rows(table, &keys).await?;
        for key in keys {
            rows.insert_loaded(RowKey::new(table, key), None);
        }
        for row in loaded {
            rows.insert_loaded(row.key(), Some(row));
        }
    }
    Ok(())
}

/// Loads the processing state of a task operation (either table) into
/// `rows`; None when it has none.
async fn load_state<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    operation_id: OperationId,
) -> Result<Option<ProcessingStateRow>, EngineError> {
    load_states(tx, rows, &[operation_id]).await?;
    Ok(state_in(rows, operation_id))
}

/// The task a claim token holds, through its lease row, with the lease;
/// Conflict when the claim no longer exists (finished, interrupted, or
/// never was). Whether the claim still holds the task is the domain's
/// decision, which the caller asks next.
async fn load_claimed<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    fence: &Fence,
) -> Result<(ProcessingStateRow, Lease), EngineError> {
    let stale = || stale_claim(fence);
    let lease = tx.lease(&fence.claim_token).await?.ok_or_else(stale)?;
    let state = load_state(tx, rows, lease.operation_id).await?.ok_or_else(stale)?;
    Ok((state, lease))
}

/// Appends `events` to a task operation's stream at the version its state
/// shows.
fn state_append(row: &ProcessingStateRow, events: Vec<NewEvent>) -> StreamAppend {
    StreamAppend {
        stream_id: StreamId::operation(row.operation_id),
        expected: ExpectedVersion::Exactly(row.version),
        events,
    }
}
