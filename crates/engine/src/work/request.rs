//! Requests: ask for a task kind on a target at the revision its inputs
//! determine. The first request creates the task's operation; a request of
//! the revision already requested is a no-op; another revision replaces
//! the requested one atomically.

use super::{state_append, state_in, TaskTarget};
use crate::error::EngineError;
use crate::load::{all_kinds, capability_statuses, load_kinds, undeclared};
use crate::tx::{spawnable, CommandContext, Decided, Stamp};
use crate::Engine;
use opledger_domain::capabilities::capability_status;
use opledger_domain::events::{Event, OperationCreated, OperationTarget};
use opledger_domain::kinds::{complete_inputs, unmet_need, BlockedOn, KindDeclaration, TaskFacts};
use opledger_domain::projections::{
    media_key, region_key, state_key, state_table, Cell, MediaRow, ProcessingStateRow, RegionRow, Row, TaskKindRow,
    WorkingSet, MEDIA_TABLE, REGIONS_TABLE,
};
use opledger_domain::revision::compute_revision;
use opledger_domain::tasks::TargetType;
use opledger_domain::transitions::Cause;
use opledger_domain::work;
use opledger_domain::{CapabilityStatus, MediaId, OperationId, OperationStatus, RegionId, StreamId};
use opledger_store::{BoxFuture, ExpectedVersion, Store, StreamAppend, WriteTx};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// A request for a task kind on a target at the revision its inputs determine.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRequest {
    pub target: TaskTarget,
    pub kind: String,
    /// The caller's inputs; what the target provides is filled in.
    pub inputs: Value,
    /// Higher runs first.
    pub priority: i32,
}

/// What a request did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RequestOutcome {
    pub operation_id: OperationId,
    pub requested_revision: String,
    /// False when that revision was already the requested one (waiting,
    /// running or completed): nothing was appended.
    pub created: bool,
    /// The task's status after the request: `queued`; `not_applicable` for
    /// an item whose media kind the task kind does not apply to; `blocked`
    /// while a capability the kind needs has not succeeded on the item.
    pub status: OperationStatus,
}

/// A prepared request: the caller's request, the id a new task operation
/// would get, and why the task cannot run where it was requested (a tool
/// or decoder this installation lacks), if it cannot: such a task is
/// recorded `blocked` with that reason instead of queued.
pub(crate) type PreparedRequest = Result<(TaskRequest, OperationId, Option<String>), EngineError>;

/// Decides a batch of task requests inside the caller's transaction: one
/// read per table for the whole batch, then one answer per request and the
/// appends that carry them out (not yet appended: the caller commits them,
/// possibly with more of its own).
pub(crate) async fn request_in_tx<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    prepared: Vec<PreparedRequest>,
    stamp: &Stamp,
) -> Result<(Vec<Result<RequestOutcome, EngineError>>, Vec<StreamAppend>), EngineError> {
    let valid = || prepared.iter().filter_map(|item| item.as_ref().ok());
    // The targets, in two reads: regions first (a region
    // names its item), then every item.
    let region_ids: BTreeSet<RegionId> = valid()
        .filter_map(|(request, _, _)| match request.target {
            TaskTarget::Region(region_id) => Some(region_id),
            TaskTarget::Media(_) => None,
        })
        .collect();
    let mut regions: BTreeMap<RegionId, RegionRow> = BTreeMap::new();
    if !region_ids.is_empty() {
        let keys: Vec<String> = region_ids.iter().map(ToString::to_string).collect();
        for row in tx.load_rows(&REGIONS_TABLE, &keys).await? {
            if let Row::Region(region) = row {
                regions.insert(region.region_id, region);
            }
        }
    }
    let media_ids: BTreeSet<MediaId> = valid()
        .filter_map(|(request, _, _)| match request.target {
            TaskTarget::Media(media_id) => Some(media_id),
            TaskTarget::Region(region_id) => regions.get(&region_id).map(|region| region.media_id),
        })
        .collect();
    let mut media: BTreeMap<MediaId, MediaRow> = BTreeMap::new();
    if !media_ids.is_empty() {
        let keys: Vec<String> = media_ids.iter().map(ToString::to_string).collect();
        for row in tx.load_rows(&MEDIA_TABLE, &keys).await? {
            if let Row::Media(item) = row {
                media.insert(item.media_id, item);
            }
        }
    }
    // The tasks these targets already have.
    let mut existing: BTreeMap<(uuid::Uuid, String), ProcessingStateRow> = BTreeMap::new();
    let media_targets: Vec<Cell> = media_ids.iter().map(|id| Cell::Uuid(id.0)).collect();
    let region_targets: Vec<Cell> = region_ids.iter().map(|id| Cell::Uuid(id.0)).collect();
    for (target_type, column, targets) in [
        (TargetType::Media, "media_id", media_targets),
        (TargetType::Region, "region_id", region_targets),
    ] {
        if targets.is_empty() {
            continue;
        }
        for row in tx.find_rows_in(state_table(target_type), column, &targets).await? {
            if let Row::ProcessingState(state) = row {
                existing.insert((state.target_id, state.task_kind.clone()), state);
            }
        }
    }
    for item in media.values() {
        rows.insert_loaded(media_key(item.media_id), Some(Row::Media(item.clone())));
    }
    for region in regions.values() {
        rows.insert_loaded(region_key(region.region_id), Some(Row::Region(region.clone())));
    }
    for state in existing.values() {
        rows.insert_loaded(
            state_key(state.target_type, state.operation_id),
            Some(Row::ProcessingState(state.clone())),
        );
    }

    // The declared kinds the batch names, and, only when one is not
    // declared, every kind (for the refusal to list them).
    let kinds = load_kinds(tx, rows, valid().map(|(request, _, _)| request.kind.as_str())).await?;
    let catalogue: Vec<TaskKindRow> =
        if valid().any(|(request, _, _)| kinds.get(&request.kind).is_none_or(|row| row.declaration.is_none())) {
            all_kinds(tx).await?
        } else {
            Vec::new()
        };

    // The items' capabilities, when a kind of the batch has needs; the
    // batch's own new tasks join them as they are decided.
    let with_needs = kinds
        .values()
        .any(|row| row.declaration.as_ref().is_some_and(|kind| !kind.needs.is_empty()));
    let mut capabilities = if with_needs {
        capability_statuses(tx, rows, &media_ids).await?
    } else {
        BTreeMap::new()
    };

    let mut answers = Vec::with_capacity(prepared.len());
    let mut appends = Vec::new();
    // (target, kind) → (operation, revision) decided in this batch.
    let mut decided: BTreeMap<(uuid::Uuid, String), (OperationId, String)> = BTreeMap::new();
    for item in prepared {
        let answer = (|| {
            let (request, new_operation_id, unavailable) = item?;
            let kind = kinds
                .get(&request.kind)
                .and_then(|row| row.declaration.as_ref())
                .ok_or_else(|| undeclared(&request.kind, &catalogue))?;
            if kind.target != request.target.target_type() {
                return Err(EngineError::invalid(format!(
                    "task kind {} runs on {} targets, not on a {}",
                    kind.name,
                    kind.target,
                    request.target.target_type()
                )));
            }
            let version = &kind.version;
            let (media_id, region_id, target_values) = target_values_of(request.target, &media, &regions)?;
            let inputs = Value::Object(complete_inputs(kind, &request.inputs, &target_values)?);
            let revision = compute_revision(&kind.name, version, &inputs)
                .map_err(|error| EngineError::invalid(format!("{} inputs: {error}", kind.name)))?;
            let media_kind = media
                .get(&media_id)
                .map(|item| item.media_kind.as_str())
                .unwrap_or_default();
            let slot = (request.target.id(), kind.name.clone());
            if let Some((operation_id, earlier)) = decided.get(&slot) {
                if *earlier == revision {
                    return Ok((
                        RequestOutcome {
                            operation_id: *operation_id,
                            requested_revision: revision,
                            created: false,
                            status: OperationStatus::Queued,
                        },
                        None,
                    ));
                }
                return Err(EngineError::invalid(format!(
                    "this batch requests {} on {} twice with different inputs",
                    kind.name,
                    request.target.id()
                )));
            }
            let (outcome, append) = match existing.get(&slot) {
                // A kind that does not apply to the item stays so at any
                // revision: a new digest does not make a video an image.
                Some(state) if state.status == OperationStatus::NotApplicable && !kind.applies_to(media_kind) => (
                    RequestOutcome {
                        operation_id: state.operation_id,
                        requested_revision: revision.clone(),
                        created: false,
                        status: state.status,
                    },
                    None,
                ),
                Some(state) => match work::decide_request(state, &revision, inputs, version) {
                    None => (
                        RequestOutcome {
                            operation_id: state.operation_id,
                            requested_revision: revision.clone(),
                            created: false,
                            status: state.status,
                        },
                        None,
                    ),
                    Some(event) => {
                        let requeued =
                            matches!(&event, Event::OperationRevisionRequested(requested) if requested.requeue);
                        let mut events = vec![stamp.event(event)];
                        let waiting =
                            requeued || !matches!(state.status, OperationStatus::Leased | OperationStatus::Running);
                        // The item's new content is of a kind this task does
                        // not apply to (a photo replaced by a sound): it is
                        // recorded so at the new revision instead of running
                        // on content it cannot read. A task a worker holds
                        // is left to its worker's answer.
                        if !kind.applies_to(media_kind) && waiting {
                            events.extend(
                                Event::for_reason(
                                    Cause::MarkNotApplicable,
                                    state.operation_id,
                                    kind.not_applicable_reason(media_kind),
                                )
                                .map(|event| stamp.event(event)),
                            );
                        // Work that runs again waits for its needs again,
                        // and cannot run where what it runs with is missing.
                        } else if let Some(reason) = unavailable.clone().filter(|_| requeued) {
                            events.extend(
                                Event::for_reason(Cause::Block, state.operation_id, reason)
                                    .map(|event| stamp.event(event)),
                            );
                        } else if let Some(need) = requeued.then(|| unmet(kind, media_id, &capabilities)).flatten() {
                            events.push(stamp.event(Event::blocked_on_need(state.operation_id, need)));
                        }
                        (
                            RequestOutcome {
                                operation_id: state.operation_id,
                                requested_revision: revision.clone(),
                                created: true,
                                status: state.status,
                            },
                            Some(state_append(state, events)),
                        )
                    }
                },
                None => {
                    // A kind that does not apply to the item's media kind is
                    // recorded as such, and never becomes claimable; one
                    // that cannot run here (what it runs with is missing)
                    // is blocked with the reason; one whose needs are unmet
                    // waits, blocked, until they are.
                    let applies = kind.applies_to(media_kind);
                    let unavailable = unavailable.filter(|_| applies);
                    let blocked_on = if applies && unavailable.is_none() {
                        unmet(kind, media_id, &capabilities)
                    } else {
                        None
                    };
                    let status = match (applies, &unavailable, &blocked_on) {
                        (false, _, _) => OperationStatus::NotApplicable,
                        (true, Some(_), _) | (true, None, Some(_)) => OperationStatus::Blocked,
                        (true, None, None) => OperationStatus::Queued,
                    };
                    let event = Event::OperationCreated(OperationCreated {
                        operation_id: new_operation_id,
                        kind: kind.name.clone(),
                        target: OperationTarget {
                            media_id: Some(media_id),
                            region_id,
                            path: None,
                        },
                        revision: Some(revision.clone()),
                        inputs,
                        status: if status == OperationStatus::Queued {
                            OperationStatus::Queued
                        } else {
                            OperationStatus::Pending
                        },
                        priority: request.priority,
                        task_version: Some(version.clone()),
                        task: Some(TaskFacts::of(kind)),
                    });
                    let mut events = vec![stamp.event(event)];
                    if !applies {
                        events.extend(
                            Event::for_reason(
                                Cause::MarkNotApplicable,
                                new_operation_id,
                                kind.not_applicable_reason(media_kind),
                            )
                            .map(|event| stamp.event(event)),
                        );
                    }
                    if let Some(reason) = unavailable {
                        events.extend(
                            Event::for_reason(Cause::Block, new_operation_id, reason).map(|event| stamp.event(event)),
                        );
                    }
                    if let Some(need) = blocked_on {
                        events.push(stamp.event(Event::blocked_on_need(new_operation_id, need)));
                    }
                    if let Some(capability) = kind.capability() {
                        capabilities
                            .entry((media_id, capability.to_string()))
                            .or_insert(capability_status(status, false));
                    }
                    (
                        RequestOutcome {
                            operation_id: new_operation_id,
                            requested_revision: revision.clone(),
                            created: true,
                            status,
                        },
                        Some(StreamAppend {
                            stream_id: StreamId::operation(new_operation_id),
                            expected: ExpectedVersion::NoStream,
                            events,
                        }),
                    )
                }
            };
            decided.insert(slot, (outcome.operation_id, revision));
            Ok((outcome, append))
        })();
        match answer {
            Ok((outcome, append)) => {
                appends.extend(append);
                answers.push(Ok(outcome));
            }
            Err(error) => answers.push(Err(error)),
        }
    }
    Ok((answers, appends))
}

/// The need of `kind` that keeps its work on `media_id` from running, if any.
fn unmet(
    kind: &KindDeclaration,
    media_id: MediaId,
    capabilities: &BTreeMap<(MediaId, String), CapabilityStatus>,
) -> Option<BlockedOn> {
    if kind.needs.is_empty() {
        return None;
    }
    unmet_need(&kind.needs, |capability| {
        capabilities.get(&(media_id, capability.to_string())).copied()
    })
}

/// A request's item, its region (for region kinds), and the inputs they
/// provide.
type TargetValues = (MediaId, Option<RegionId>, Map<String, Value>);

/// What a request's target contributes to its inputs: the media item's
/// digest; for a region also its box and revision. NotFound for a target
/// the batch's reads did not find.
fn target_values_of(
    target: TaskTarget,
    media: &BTreeMap<MediaId, MediaRow>,
    regions: &BTreeMap<RegionId, RegionRow>,
) -> Result<TargetValues, EngineError> {
    let mut values = Map::new();
    let (media_id, region_id) = match target {
        TaskTarget::Media(media_id) => (media_id, None),
        TaskTarget::Region(region_id) => {
            let region = regions
                .get(&region_id)
                .ok_or_else(|| EngineError::not_found("region", region_id))?;
            values.insert(
                "bbox".to_string(),
                serde_json::json!({"x": region.x, "y": region.y, "width": region.width, "height": region.height}),
            );
            values.insert("region_revision".to_string(), Value::from(region.region_revision));
            (region.media_id, Some(region_id))
        }
    };
    let item = media
        .get(&media_id)
        .ok_or_else(|| EngineError::not_found("media", media_id))?;
    if let Some(digest) = &item.content_digest {
        values.insert("content_digest".to_string(), Value::String(digest.clone()));
    }
    values.insert("media_kind".to_string(), Value::String(item.media_kind.clone()));
    Ok((media_id, region_id, values))
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
                    return Err(EngineError::invalid(format!(
                        "{} inputs must be a JSON object",
                        request.kind.chars().take(64).collect::<String>()
                    )));
                }
                Ok((request, OperationId(self.ids.next()), None))
            })
            .collect()
    }
}
