//! The review queue's commands and queries, and capability states.
//!
//! Resolving an entry is a recorded action (`review_resolved`, with actor
//! and reason, on the operation's stream); a retry re-enters the work
//! protocol in the same transaction (the operation reopened, or its
//! revision requested again), and the entry closes when the work succeeds.
//! Retrying work blocked by a need whose work ended without a result
//! retries that work: the need's operation is reopened, and the blocked
//! task waits for it again.

use crate::error::EngineError;
use crate::load::load_operation;
use crate::tx::{CommandContext, Decided, Stamp};
use crate::Engine;
use opledger_domain::events::{Event, OperationRevisionRequested, ReviewResolved};
use opledger_domain::kinds::BlockedOn;
use opledger_domain::projections::{
    CapabilityRow, Cell, OperationRow, ReviewRow, Row, WorkingSet, CAPABILITY_STATES_TABLE, REVIEW_TABLE,
};
use opledger_domain::review::{EntryState, ReviewAction};
use opledger_domain::transitions::{self, Cause};
use opledger_domain::{DomainError, MediaId, OperationStatus, StreamId};
use opledger_store::{ExpectedVersion, Store, StreamAppend, WriteTx};

impl<S: Store> Engine<S> {
    /// Open review entries, oldest first.
    pub async fn review_entries(&self) -> Result<Vec<ReviewRow>, EngineError> {
        let mut entries: Vec<ReviewRow> = self
            .store
            .find_rows(
                &REVIEW_TABLE,
                &[("state", Cell::Text(EntryState::Open.as_str().to_string()))],
                usize::MAX,
            )
            .await?
            .into_iter()
            .filter_map(|row| match row {
                Row::Review(entry) => Some(entry),
                _ => None,
            })
            .collect();
        entries.sort_by_key(|entry| entry.entry_id);
        Ok(entries)
    }

    /// One entry by id, whatever its state.
    pub async fn review_entry(&self, entry_id: i64) -> Result<ReviewRow, EngineError> {
        match self
            .store
            .find_rows(&REVIEW_TABLE, &[("entry_id", Cell::Integer(entry_id))], 1)
            .await?
            .pop()
        {
            Some(Row::Review(entry)) => Ok(entry),
            _ => Err(EngineError::not_found("review entry", entry_id)),
        }
    }

    /// Resolves an open entry by a recorded action. `retry` reopens the
    /// work (at `revision` when given: the requested revision, or one the
    /// operation was requested at before); `dismiss` and `acknowledge`
    /// close the entry and leave the work as it is.
    pub async fn resolve_review(
        &self,
        context: &CommandContext,
        entry_id: i64,
        action: ReviewAction,
        revision: Option<String>,
        reason: &str,
    ) -> Result<ReviewRow, EngineError> {
        if revision.is_some() && action != ReviewAction::Retry {
            return Err(EngineError::invalid("--revision goes with the retry action only"));
        }
        let entry = self.review_entry(entry_id).await?;
        // A retry at an older revision needs that revision's inputs: they
        // are in the operation's history.
        let requested_at = match &revision {
            Some(revision) => Some(self.revision_inputs(entry.operation_id, revision).await?),
            None => None,
        };
        let reason = if reason.trim().is_empty() {
            format!("{action} from the review queue")
        } else {
            reason.trim().to_string()
        };
        let once = context.once(
            "review.resolve",
            serde_json::json!({"entry_id": entry_id, "action": action, "revision": revision, "reason": reason}),
        );
        let stamp = self.stamp(context);
        let operation_id = entry.operation_id;
        self.stamped_once(once, stamp, move |tx, rows, stamp| {
            Box::pin(async move {
                let current = match tx
                    .find_rows(&REVIEW_TABLE, &[("entry_id", Cell::Integer(entry_id))], 1)
                    .await?
                    .pop()
                {
                    Some(Row::Review(entry)) => entry,
                    _ => return Err(EngineError::not_found("review entry", entry_id)),
                };
                if current.state != EntryState::Open {
                    return Err(EngineError::Domain(DomainError::Conflict(format!(
                        "review entry {entry_id} is {}, not open",
                        current.state
                    ))));
                }
                let operation = load_operation(tx, rows, operation_id).await?;
                let mut events = vec![Event::ReviewResolved(ReviewResolved {
                    operation_id,
                    entry_id,
                    action: action.as_str().to_string(),
                    reason: reason.clone(),
                    revision: revision.clone(),
                })];
                let mut appends = Vec::new();
                match (action, stuck_need(&operation), &requested_at) {
                    (ReviewAction::Retry, Some(need), None) => {
                        appends.push(retry_need(tx, rows, &operation, need, &reason, &stamp).await?);
                    }
                    (ReviewAction::Retry, _, _) => events.extend(retry_events(&operation, requested_at, &reason)?),
                    (ReviewAction::Dismiss | ReviewAction::Acknowledge, _, _) => {}
                }
                let events = events.into_iter().map(|event| stamp.event(event)).collect();
                appends.insert(
                    0,
                    StreamAppend {
                        stream_id: StreamId::operation(operation_id),
                        expected: ExpectedVersion::Exactly(operation.version),
                        events,
                    },
                );
                Ok(Decided::answer((), appends))
            })
        })
        .await?;
        self.review_entry(entry_id).await
    }

    /// The inputs and task version an operation was requested with at
    /// `revision`, from its history.
    async fn revision_inputs(
        &self,
        operation_id: opledger_domain::OperationId,
        revision: &str,
    ) -> Result<(String, serde_json::Value, Option<String>), EngineError> {
        let events = self.store.read_stream(&StreamId::operation(operation_id)).await?;
        events
            .iter()
            .rev()
            .find_map(|envelope| match &envelope.event {
                Event::OperationCreated(created) if created.revision.as_deref() == Some(revision) => Some((
                    revision.to_string(),
                    created.inputs.clone(),
                    created.task_version.clone(),
                )),
                Event::OperationRevisionRequested(requested) if requested.revision == revision => Some((
                    revision.to_string(),
                    requested.inputs.clone(),
                    requested.task_version.clone(),
                )),
                _ => None,
            })
            .ok_or_else(|| {
                EngineError::invalid(format!(
                    "operation {operation_id} was never requested at revision {revision}"
                ))
            })
    }

    /// The capability states of one media item, by capability name.
    pub async fn capabilities(&self, media_id: MediaId) -> Result<Vec<CapabilityRow>, EngineError> {
        self.media(media_id).await?;
        let mut rows: Vec<CapabilityRow> = self
            .store
            .find_rows(
                &CAPABILITY_STATES_TABLE,
                &[("media_id", Cell::Uuid(media_id.0))],
                usize::MAX,
            )
            .await?
            .into_iter()
            .filter_map(|row| match row {
                Row::Capability(capability) => Some(capability),
                _ => None,
            })
            .collect();
        rows.sort_by(|a, b| a.capability.cmp(&b.capability));
        Ok(rows)
    }
}

/// The need a blocked operation waits for, when that need's work ended
/// without a result (a block a person can act on by retrying the need).
fn stuck_need(operation: &OperationRow) -> Option<&BlockedOn> {
    operation
        .blocked_on
        .as_ref()
        .filter(|need| operation.status == OperationStatus::Blocked && !need.is_waiting())
}

/// Retrying work blocked by `need` retries the need's work on the item:
/// its operation is reopened (the blocked work then waits for it again,
/// and runs once it succeeds). Refused, naming the need, when that work
/// cannot run again (it does not apply to the item).
async fn retry_need<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    operation: &OperationRow,
    need: &BlockedOn,
    reason: &str,
    stamp: &Stamp,
) -> Result<StreamAppend, EngineError> {
    let media_id = operation
        .media_id
        .ok_or_else(|| EngineError::invalid("a blocked task without a media item has no need to retry"))?;
    let needed = match tx
        .find_rows(
            &CAPABILITY_STATES_TABLE,
            &[
                ("media_id", Cell::Uuid(media_id.0)),
                ("capability", Cell::Text(need.capability.clone())),
            ],
            1,
        )
        .await?
        .pop()
    {
        Some(Row::Capability(capability)) => capability,
        _ => return Err(EngineError::not_found("capability", &need.capability)),
    };
    let producer = load_operation(tx, rows, needed.operation_id).await?;
    transitions::transition(producer.status, Cause::Reopen).map_err(|_| {
        EngineError::Domain(DomainError::Conflict(format!(
            "{} waits for {need}, whose {} task is {} and cannot be retried; dismiss or acknowledge this entry",
            operation.kind, producer.kind, producer.status
        )))
    })?;
    let reopen = Event::for_reason(
        Cause::Reopen,
        producer.operation_id,
        format!("retry of {} from the review queue: {reason}", operation.kind),
    )
    .expect("a reopen carries a reason only");
    Ok(StreamAppend {
        stream_id: StreamId::operation(producer.operation_id),
        expected: ExpectedVersion::Exactly(producer.version),
        events: vec![stamp.event(reopen)],
    })
}

/// The events that put an operation back to work for a retry from the
/// queue: a request of the given revision (when it is not the requested
/// one), else a reopen; blocked work is unblocked and queued.
fn retry_events(
    operation: &OperationRow,
    requested_at: Option<(String, serde_json::Value, Option<String>)>,
    reason: &str,
) -> Result<Vec<Event>, EngineError> {
    let operation_id = operation.operation_id;
    if let Some((revision, inputs, task_version)) = requested_at {
        if operation.revision.as_deref() != Some(revision.as_str()) {
            transitions::transition(operation.status, Cause::Request)?;
            return Ok(vec![Event::OperationRevisionRequested(OperationRevisionRequested {
                operation_id,
                revision,
                inputs,
                requeue: true,
                task_version,
                reason: None,
            })]);
        }
    }
    if operation.status == OperationStatus::Blocked {
        let unblock = Event::for_reason(Cause::Unblock, operation_id, reason.to_string());
        let enqueue = Event::for_reason(Cause::Enqueue, operation_id, reason.to_string());
        return Ok(unblock.into_iter().chain(enqueue).collect());
    }
    transitions::transition(operation.status, Cause::Reopen)?;
    Ok(Event::for_reason(Cause::Reopen, operation_id, reason.to_string())
        .into_iter()
        .collect())
}
