//! Applicability: a task that goes back to the queue — its worker answered
//! for a revision no longer requested, gave its claim back, or was
//! requeued after an interruption — runs next at the requested revision,
//! on the item's content as it is now. When that content is of a media
//! kind the task's kind does not apply to (a photo replaced by a sound
//! while a worker held the photo's task), the task is recorded
//! `not_applicable` with the reason a request gives, instead of waiting
//! to be claimed and to fail on content it cannot read. A request at the
//! new revision does the same for a task no worker holds
//! (`work::request`); this reaction covers the task a worker held then.
//!
//! It reads nothing unless the command requeued a task on a media item;
//! then that item's registry row and the kind's declaration, by key.

use super::follows;
use crate::error::EngineError;
use opledger_domain::projections::{
    media_key, operation_key, OperationRow, Row, WorkingSet, MEDIA_TABLE, OPERATIONS_TABLE, TASK_KINDS_TABLE,
};
use opledger_domain::{Cause, Event, EventEnvelope, MediaId, OperationId, OperationStatus, StreamId};
use opledger_store::{ExpectedVersion, StreamAppend, WriteTx};
use std::collections::BTreeMap;

/// The causes that put a held task back in the queue, for the requested
/// revision: the only way a task a worker held reaches new content.
fn requeues(cause: Cause) -> bool {
    matches!(cause, Cause::Supersede | Cause::Release | Cause::Requeue)
}

pub(super) async fn mark_not_applicable<T: WriteTx>(
    tx: &mut T,
    rows: &WorkingSet,
    envelopes: &[EventEnvelope],
) -> Result<Vec<StreamAppend>, EngineError> {
    let mut requeued: BTreeMap<OperationId, &EventEnvelope> = BTreeMap::new();
    for envelope in envelopes {
        if let (Some(operation_id), Some(cause)) = (envelope.event.operation_id(), envelope.event.cause()) {
            if requeues(cause) {
                requeued.insert(operation_id, envelope);
            }
        }
    }
    if requeued.is_empty() {
        return Ok(Vec::new());
    }
    let operations = queued_on_media(tx, rows, requeued.keys().copied().collect()).await?;
    let mut appends = Vec::new();
    for (operation, media_id) in operations {
        let Some(envelope) = requeued.get(&operation.operation_id) else {
            continue;
        };
        let Some(media_kind) = media_kind(tx, rows, media_id).await? else {
            continue;
        };
        let declaration = tx
            .load_rows(&TASK_KINDS_TABLE, std::slice::from_ref(&operation.kind))
            .await?
            .into_iter()
            .find_map(|row| match row {
                Row::TaskKind(kind) => kind.declaration,
                _ => None,
            });
        let Some(kind) = declaration.filter(|kind| !kind.applies_to(&media_kind)) else {
            continue;
        };
        let reason = kind.not_applicable_reason(&media_kind);
        appends.push(StreamAppend {
            stream_id: StreamId::operation(operation.operation_id),
            expected: ExpectedVersion::Exactly(operation.version),
            events: Event::for_reason(Cause::MarkNotApplicable, operation.operation_id, reason)
                .map(|event| follows(envelope, event))
                .into_iter()
                .collect(),
        });
    }
    Ok(appends)
}

/// The operations among `ids` that the events left queued, on a media
/// item, with it.
async fn queued_on_media<T: WriteTx>(
    tx: &mut T,
    rows: &WorkingSet,
    ids: Vec<OperationId>,
) -> Result<Vec<(OperationRow, MediaId)>, EngineError> {
    let mut operations = Vec::new();
    let mut unknown = Vec::new();
    for id in ids {
        match rows.get(&operation_key(id)) {
            Some(Row::Operation(operation)) => operations.push(operation.clone()),
            _ => unknown.push(operation_key(id).key.to_string()),
        }
    }
    if !unknown.is_empty() {
        for row in tx.load_rows(&OPERATIONS_TABLE, &unknown).await? {
            if let Row::Operation(operation) = row {
                operations.push(operation);
            }
        }
    }
    Ok(operations
        .into_iter()
        .filter(|operation| operation.status == OperationStatus::Queued)
        .filter_map(|operation| operation.media_id.map(|media_id| (operation, media_id)))
        .collect())
}

/// The item's media kind as the registry has it now.
async fn media_kind<T: WriteTx>(
    tx: &mut T,
    rows: &WorkingSet,
    media_id: MediaId,
) -> Result<Option<String>, EngineError> {
    let key = media_key(media_id);
    if let Some(Row::Media(media)) = rows.get(&key) {
        return Ok(Some(media.media_kind.clone()));
    }
    Ok(tx
        .load_rows(&MEDIA_TABLE, &[key.key.to_string()])
        .await?
        .into_iter()
        .find_map(|row| match row {
            Row::Media(media) => Some(media.media_kind),
            _ => None,
        }))
}
