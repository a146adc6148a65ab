//! Requests: ask for a task kind on a target at the revision its inputs
//! determine. The first request creates the task's operation; a request of
//! the revision already requested is a no-op; another revision replaces
//! the requested one atomically.

use super::state_in;
use crate::error::EngineError;
use crate::load::{all_kinds, capability_statuses, declared_names, load_kinds};
use crate::tx::{spawnable, CommandContext, Decided, Stamp};
use crate::Engine;
use opledger_domain::projections::{
    media_key, region_key, state_key, state_table, Cell, Row, WorkingSet, MEDIA_TABLE, REGIONS_TABLE,
};
use opledger_domain::requests::{decide_requests, PlannedRequest, RequestState, TaskTarget};
pub use opledger_domain::requests::{RequestOutcome, TaskRequest};
use opledger_domain::tasks::TargetType;
use opledger_domain::{DomainError, MediaId, OperationId, RegionId, StreamId};
use opledger_store::{BoxFuture, ExpectedVersion, Store, StreamAppend, WriteTx};
use std::collections::BTreeSet;

/// A prepared request: ready for the domain's decision, or already
/// refused for its shape.
pub(crate) type PreparedRequest = Result<PlannedRequest, DomainError>;

/// Decides a batch of task requests inside the caller's transaction: one
/// read per table for the whole batch, the domain's decision for each
/// request, and the appends that carry them out (not yet appended: the
/// caller commits them, possibly with more of its own).
pub(crate) async fn request_in_tx<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    prepared: Vec<PreparedRequest>,
    stamp: &Stamp,
) -> Result<(Vec<Result<RequestOutcome, EngineError>>, Vec<StreamAppend>), EngineError> {
    let mut state = load_request_state(tx, rows, &prepared).await?;
    let decisions = decide_requests(&mut state, prepared);
    let mut appends = Vec::new();
    let answers = decisions
        .into_iter()
        .map(|decision| {
            let decision = decision?;
            appends.extend(decision.events.map(|decided| {
                StreamAppend {
                    stream_id: StreamId::operation(decided.operation_id),
                    expected: decided
                        .after_version
                        .map_or(ExpectedVersion::NoStream, ExpectedVersion::Exactly),
                    events: decided.events.into_iter().map(|event| stamp.event(event)).collect(),
                }
            }));
            Ok(decision.outcome)
        })
        .collect();
    Ok((answers, appends))
}

/// What a batch of requests is decided against, read in two reads for the
/// targets (regions first: a region names its item), one per task table,
/// one for the kinds named, and the items' capabilities when a kind has
/// needs. What is read joins the working set, for the fold.
async fn load_request_state<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    prepared: &[PreparedRequest],
) -> Result<RequestState, EngineError> {
    let valid = || {
        prepared
            .iter()
            .filter_map(|item| item.as_ref().ok())
            .map(|planned| &planned.request)
    };
    let region_ids: BTreeSet<RegionId> = valid()
        .filter_map(|request| match request.target {
            TaskTarget::Region(region_id) => Some(region_id),
            TaskTarget::Media(_) => None,
        })
        .collect();
    let mut state = RequestState::default();
    if !region_ids.is_empty() {
        let keys: Vec<String> = region_ids.iter().map(ToString::to_string).collect();
        for row in tx.load_rows(&REGIONS_TABLE, &keys).await? {
            if let Row::Region(region) = row {
                rows.insert_loaded(region_key(region.region_id), Some(Row::Region(region.clone())));
                state.regions.insert(region.region_id, region);
            }
        }
    }
    let media_ids: BTreeSet<MediaId> = valid()
        .filter_map(|request| match request.target {
            TaskTarget::Media(media_id) => Some(media_id),
            TaskTarget::Region(region_id) => state.regions.get(&region_id).map(|region| region.media_id),
        })
        .collect();
    if !media_ids.is_empty() {
        let keys: Vec<String> = media_ids.iter().map(ToString::to_string).collect();
        for row in tx.load_rows(&MEDIA_TABLE, &keys).await? {
            if let Row::Media(item) = row {
                rows.insert_loaded(media_key(item.media_id), Some(Row::Media(item.clone())));
                state.media.insert(item.media_id, item);
            }
        }
    }
    for (target_type, column, targets) in [
        (
            TargetType::Media,
            "media_id",
            media_ids.iter().map(|id| Cell::Uuid(id.0)).collect::<Vec<_>>(),
        ),
        (
            TargetType::Region,
            "region_id",
            region_ids.iter().map(|id| Cell::Uuid(id.0)).collect(),
        ),
    ] {
        if targets.is_empty() {
            continue;
        }
        for row in tx.find_rows_in(state_table(target_type), column, &targets).await? {
            if let Row::ProcessingState(task) = row {
                rows.insert_loaded(
                    state_key(task.target_type, task.operation_id),
                    Some(Row::ProcessingState(task.clone())),
                );
                state.tasks.insert((task.target_id, task.task_kind.clone()), task);
            }
        }
    }
    // The declared kinds the batch names, and, only when one is not
    // declared, every kind's name (for the refusal to list them).
    let kinds = load_kinds(tx, rows, valid().map(|request| request.kind.as_str())).await?;
    state.kinds = kinds
        .into_values()
        .filter_map(|row| row.declaration.map(|declaration| (row.name, declaration)))
        .collect();
    if valid().any(|request| !state.kinds.contains_key(&request.kind)) {
        state.declared = declared_names(&all_kinds(tx).await?);
    }
    if state.kinds.values().any(|kind| !kind.needs.is_empty()) {
        state.capabilities = capability_statuses(tx, rows, &media_ids).await?;
    }
    Ok(state)
}

impl<S: Store> Engine<S> {
    /// Requests a task kind on a target at the revision its inputs
    /// determine. The first request creates the task's operation; a request
    /// for the revision already requested is a no-op; another revision
    /// replaces the requested one atomically (a worker running the old one
    /// finishes it, and the task is then claimable for the new one).
    pub fn request_task<'a>(
        &'a self,
        context: &'a CommandContext,
        request: TaskRequest,
    ) -> BoxFuture<'a, Result<RequestOutcome, EngineError>> {
        spawnable(async move {
            let target = match request.target {
                TaskTarget::Media(media_id) => serde_json::json!({"media": media_id}),
                TaskTarget::Region(region_id) => serde_json::json!({"region": region_id}),
            };
            let once = context.once(
                "task.request",
                serde_json::json!({
                    "target": target,
                    "kind": request.kind,
                    "inputs": request.inputs,
                    "priority": request.priority,
                }),
            );
            let prepared = self.prepare_requests(vec![request]);
            let stamp = self.stamp(context);
            self.stamped_once(once, stamp, move |tx, rows, stamp| {
                Box::pin(async move {
                    let (mut answers, appends) = request_in_tx(tx, rows, prepared, &stamp).await?;
                    // A refused request refuses the command.
                    let mut outcome = answers.pop().expect("one request gets one answer")?;
                    Ok(Decided::then(appends, move |rows, _| {
                        if let Some(state) = state_in(rows, outcome.operation_id) {
                            outcome.status = state.status;
                        }
                        Ok(outcome)
                    }))
                })
            })
            .await
        })
    }

    /// Requests many tasks in one transaction (a scheduler enqueueing a
    /// batch). Each request is checked and answered on its own: a refused
    /// one is its own error and does not stop the others. Two requests for
    /// the same kind on the same target in one batch must agree on the
    /// revision.
    pub fn request_tasks<'a>(
        &'a self,
        context: &'a CommandContext,
        requests: Vec<TaskRequest>,
    ) -> BoxFuture<'a, Result<Vec<Result<RequestOutcome, EngineError>>, EngineError>> {
        spawnable(async move {
            context.refuse_request_id("requesting many tasks in one call")?;
            let prepared = self.prepare_requests(requests);
            let stamp = self.stamp(context);
            self.stamped(stamp, move |tx, rows, stamp| {
                Box::pin(async move {
                    let (answers, appends) = request_in_tx(tx, rows, prepared, &stamp).await?;
                    // Each answer says where its task stands once the
                    // appends are folded.
                    Ok(Decided::then(appends, move |rows, _| {
                        Ok(answers
                            .into_iter()
                            .map(|answer| {
                                answer.map(|mut outcome| {
                                    if let Some(state) = state_in(rows, outcome.operation_id) {
                                        outcome.status = state.status;
                                    }
                                    outcome
                                })
                            })
                            .collect())
                    }))
                })
            })
            .await
        })
    }

    /// Checks each request's shape and fixes the id a new task would get;
    /// the kind is checked against its declaration in the transaction.
    pub(crate) fn prepare_requests(&self, requests: Vec<TaskRequest>) -> Vec<PreparedRequest> {
        requests
            .into_iter()
            .map(|request| {
                if !request.inputs.is_object() {
                    return Err(DomainError::InvalidInput(format!(
                        "{} inputs must be a JSON object",
                        request.kind.chars().take(64).collect::<String>()
                    )));
                }
                Ok(PlannedRequest {
                    request,
                    new_operation_id: OperationId(self.ids.next()),
                    unavailable: None,
                })
            })
            .collect()
    }
}
