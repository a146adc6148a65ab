//! Needs: a task whose kind needs capabilities of its item waits, blocked,
//! until they have succeeded (the request records the block). This
//! reaction looks again whenever work on an item settles or is reopened:
//! the item's tasks blocked by a need are queued once every need has
//! succeeded — unblocked and enqueued, reason `dependency_satisfied` — or
//! blocked again when the need they wait for changed standing (its work
//! ended without a result, or was reopened, or another need is now the one
//! they wait for). A block by a person or caller (no need recorded) is
//! left to them.
//!
//! It reads nothing unless the command settled or reopened a capability's
//! work while some task in the ledger is blocked (the running count of
//! operations by status, which the fold of those events left in the
//! working set, says so), and then one indexed read of the items'
//! processing states.

use super::follows;
use crate::error::EngineError;
use crate::load::capability_statuses;
use opledger_domain::kinds::{unmet_need, DEPENDENCY_SATISFIED};
use opledger_domain::projections::{
    capability_key, counts_key, operation_key, state_table, Cell, OperationRow, ProcessingStateRow, Row, WorkingSet,
    BY_STATUS, OPERATIONS_TABLE, OPERATION_COUNTS_TABLE, TASK_KINDS_TABLE,
};
use opledger_domain::tasks::TargetType;
use opledger_domain::{Cause, Event, EventEnvelope, MediaId, OperationId, OperationStatus, StreamId};
use opledger_store::{ExpectedVersion, StreamAppend, WriteTx};
use std::collections::{BTreeMap, BTreeSet};

/// Whether an operation moved by `cause` may change where its capability
/// stands for the tasks that need it: it succeeded, ended without a
/// result, or was reopened. Claims, retries, interruptions and releases keep it
/// in progress, and a need in progress is waited for either way.
fn moves_a_need(cause: Cause) -> bool {
    match cause {
        Cause::Succeed
        | Cause::FindNothing
        | Cause::ConfirmMissing
        | Cause::MarkNotApplicable
        | Cause::Skip
        | Cause::FailTerminal
        | Cause::DeadLetter
        | Cause::Cancel
        | Cause::Reopen
        | Cause::Request => true,
        Cause::Enqueue
        | Cause::Block
        | Cause::Unblock
        | Cause::Claim
        | Cause::Start
        | Cause::FailRetryable
        | Cause::ScheduleRetry
        | Cause::Interrupt
        | Cause::Requeue
        | Cause::Supersede
        | Cause::Release => false,
    }
}

pub(super) async fn release_dependents<T: WriteTx>(
    tx: &mut T,
    rows: &WorkingSet,
    envelopes: &[EventEnvelope],
) -> Result<Vec<StreamAppend>, EngineError> {
    // The items whose capabilities moved, each with the last event that
    // moved one (what the reaction's events follow).
    let mut moved: BTreeMap<MediaId, &EventEnvelope> = BTreeMap::new();
    for envelope in envelopes {
        let (Some(operation_id), Some(cause)) = (envelope.event.operation_id(), envelope.event.cause()) else {
            continue;
        };
        if !moves_a_need(cause) {
            continue;
        }
        if let Some(Row::Capability(capability)) = rows.get(&capability_key(operation_id)) {
            moved.insert(capability.media_id, envelope);
        }
    }
    if moved.is_empty() || !any_blocked(rows) {
        return Ok(Vec::new());
    }

    // Their blocked tasks, then those blocked by a need.
    let items: Vec<Cell> = moved.keys().map(|id| Cell::Uuid(id.0)).collect();
    let blocked: Vec<ProcessingStateRow> = tx
        .find_rows_in(state_table(TargetType::Media), "media_id", &items)
        .await?
        .into_iter()
        .filter_map(|stored| match rows.get(&stored.key()).unwrap_or(&stored) {
            Row::ProcessingState(state) if state.status == OperationStatus::Blocked => Some(state.clone()),
            _ => None,
        })
        .collect();
    if blocked.is_empty() {
        return Ok(Vec::new());
    }
    let waiting = blocked_by_needs(tx, rows, &blocked).await?;
    if waiting.is_empty() {
        return Ok(Vec::new());
    }

    // Their kinds' needs, against the items' capabilities now.
    let names: Vec<String> = waiting
        .iter()
        .map(|(_, operation)| operation.kind.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let kinds: BTreeMap<String, Vec<String>> = tx
        .load_rows(&TASK_KINDS_TABLE, &names)
        .await?
        .into_iter()
        .filter_map(|row| match row {
            Row::TaskKind(kind) => kind.declaration.map(|declaration| (kind.name, declaration.needs)),
            _ => None,
        })
        .collect();
    let media_ids: BTreeSet<MediaId> = waiting.iter().map(|(media_id, _)| *media_id).collect();
    let capabilities = capability_statuses(tx, rows, &media_ids).await?;

    let mut appends = Vec::new();
    for (media_id, operation) in waiting {
        let (Some(needs), Some(envelope)) = (kinds.get(&operation.kind), moved.get(&media_id)) else {
            continue;
        };
        let now_unmet = unmet_need(needs, |capability| {
            capabilities.get(&(media_id, capability.to_string())).copied()
        });
        let events = match now_unmet {
            None => [Cause::Unblock, Cause::Enqueue]
                .into_iter()
                .filter_map(|cause| Event::for_reason(cause, operation.operation_id, DEPENDENCY_SATISFIED.to_string()))
                .collect(),
            Some(need) if Some(&need) != operation.blocked_on.as_ref() => {
                vec![Event::blocked_on_need(operation.operation_id, need)]
            }
            Some(_) => continue,
        };
        appends.push(StreamAppend {
            stream_id: StreamId::operation(operation.operation_id),
            expected: ExpectedVersion::Exactly(operation.version),
            events: events.into_iter().map(|event| follows(envelope, event)).collect(),
        });
    }
    Ok(appends)
}

/// Whether any operation in the ledger may be blocked: false only when
/// the running count by status, as this transaction's fold left it, has
/// none (a count not in the working set may have some).
fn any_blocked(rows: &WorkingSet) -> bool {
    match rows.get(&counts_key(&OPERATION_COUNTS_TABLE, BY_STATUS)) {
        Some(Row::Counts(counts)) => counts
            .counts
            .get(OperationStatus::Blocked.as_str())
            .is_some_and(|count| *count > 0),
        _ => true,
    }
}

/// The operations of these blocked tasks that wait for a need, with their
/// item.
async fn blocked_by_needs<T: WriteTx>(
    tx: &mut T,
    rows: &WorkingSet,
    blocked: &[ProcessingStateRow],
) -> Result<Vec<(MediaId, OperationRow)>, EngineError> {
    let ids: Vec<OperationId> = blocked.iter().map(|state| state.operation_id).collect();
    let unknown: Vec<String> = ids
        .iter()
        .map(|id| operation_key(*id))
        .filter(|key| rows.get(key).is_none())
        .map(|key| key.key.to_string())
        .collect();
    let mut operations: BTreeMap<OperationId, OperationRow> = BTreeMap::new();
    if !unknown.is_empty() {
        for row in tx.load_rows(&OPERATIONS_TABLE, &unknown).await? {
            if let Row::Operation(operation) = row {
                operations.insert(operation.operation_id, operation);
            }
        }
    }
    for id in &ids {
        if let Some(Row::Operation(operation)) = rows.get(&operation_key(*id)) {
            operations.insert(*id, operation.clone());
        }
    }
    Ok(operations
        .into_values()
        .filter(|operation| operation.status == OperationStatus::Blocked && operation.blocked_on.is_some())
        .filter_map(|operation| operation.media_id.map(|media_id| (media_id, operation)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_settling_or_reopening_work_moves_a_need() {
        let moving: Vec<&str> = Cause::ALL
            .iter()
            .filter(|cause| moves_a_need(**cause))
            .map(|cause| cause.as_str())
            .collect();
        assert_eq!(
            moving,
            [
                "succeed",
                "find_nothing",
                "confirm_missing",
                "mark_not_applicable",
                "skip",
                "fail_terminal",
                "dead_letter",
                "cancel",
                "reopen",
                "request"
            ]
        );
        // Every cause that settles an operation is among them: a settled
        // need is never missed.
        for cause in Cause::ALL {
            if cause.destination().is_terminal() {
                assert!(moves_a_need(*cause), "{cause}");
            }
        }
    }
}
