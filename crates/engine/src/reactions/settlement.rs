//! Completion reconciliation: for every operation a command's events
//! settled, the batches holding it as an unsettled item record its outcome,
//! on each batch's stream, right after the events that settled it.
//!
//! An operation blocked by a need whose work ended without a result is
//! settled too (outcome `blocked`): nothing but a person can let it run, so
//! its batch must not wait for it. Such an item takes the outcome its work
//! reaches if it runs and settles later (`ItemOutcome::is_replaced_by`).

use super::follows;
use crate::error::EngineError;
use opledger_domain::batches::{ingestion_failures, item_outcome, ItemOutcome};
use opledger_domain::events::{BatchItemSettled, Event};
use opledger_domain::projections::{operation_key, Cell, OperationRow, Row, WorkingSet, BATCH_ITEMS_TABLE};
use opledger_domain::{BatchId, EventEnvelope, NewEvent, OperationId, StreamId};
use opledger_store::{ExpectedVersion, StreamAppend, WriteTx};
use std::collections::BTreeMap;

pub(super) async fn batch_settlements<T: WriteTx>(
    tx: &mut T,
    rows: &WorkingSet,
    envelopes: &[EventEnvelope],
) -> Result<Vec<StreamAppend>, EngineError> {
    // The settling event of each operation: the last status change.
    let mut settling: BTreeMap<OperationId, &EventEnvelope> = BTreeMap::new();
    for envelope in envelopes {
        let (Some(operation_id), Some(_)) = (envelope.event.operation_id(), envelope.event.cause()) else {
            continue;
        };
        settling.insert(operation_id, envelope);
    }
    settling.retain(|operation_id, _| {
        matches!(rows.get(&operation_key(*operation_id)), Some(Row::Operation(operation)) if item_outcome(operation.status, operation.blocked_on.as_ref()).is_some())
    });
    if settling.is_empty() {
        return Ok(Vec::new());
    }
    let values: Vec<Cell> = settling.keys().map(|id| Cell::Uuid(id.0)).collect();
    let items = tx.find_rows_in(&BATCH_ITEMS_TABLE, "operation_id", &values).await?;
    let mut by_batch: BTreeMap<BatchId, Vec<NewEvent>> = BTreeMap::new();
    for row in items {
        let Row::BatchItem(item) = row else { continue };
        let (Some(envelope), Some(Row::Operation(operation))) = (
            settling.get(&item.operation_id),
            rows.get(&operation_key(item.operation_id)),
        ) else {
            continue;
        };
        let Some(outcome) = item_outcome(operation.status, operation.blocked_on.as_ref()) else {
            continue;
        };
        let (outcome, reason) = match ingestion_failures(&operation.kind, &envelope.event) {
            Some(failures) => (ItemOutcome::Failed, Some(failures)),
            None => (outcome, settlement_reason(outcome, operation)),
        };
        if item.outcome.is_some_and(|earlier| !earlier.is_replaced_by(outcome)) {
            continue;
        }
        by_batch.entry(item.batch_id).or_default().push(follows(
            envelope,
            Event::BatchItemSettled(BatchItemSettled {
                batch_id: item.batch_id,
                operation_id: item.operation_id,
                outcome: outcome.as_str().to_string(),
                status: operation.status,
                reason,
            }),
        ));
    }
    Ok(by_batch
        .into_iter()
        .map(|(batch_id, events)| StreamAppend {
            stream_id: StreamId::batch(batch_id),
            expected: ExpectedVersion::Any,
            events,
        })
        .collect())
}

/// Why an item settled as it did: the error for a failure, the recorded
/// reason otherwise (an earlier attempt's error is no reason for a success).
pub(crate) fn settlement_reason(outcome: ItemOutcome, operation: &OperationRow) -> Option<String> {
    match outcome {
        ItemOutcome::Failed => operation.last_error.clone().or_else(|| operation.status_reason.clone()),
        ItemOutcome::Succeeded | ItemOutcome::Skipped | ItemOutcome::Cancelled | ItemOutcome::Blocked => {
            operation.status_reason.clone()
        }
    }
}
