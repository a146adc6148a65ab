//! Deciding task requests: given what a batch of requests names (the
//! declared kinds, the target items and regions, the tasks they already
//! have, the items' capabilities), the answer to each request and the
//! events that carry it out. The engine loads that state inside its write
//! transaction, calls [`decide_requests`], and appends what it returns.
//!
//! The rules: the first request of a kind on a target creates its task
//! (queued; `not_applicable` where the kind does not apply to the item's
//! media kind; `blocked` while a need is unmet or what it runs with is
//! missing here); a request of the revision already requested is a no-op;
//! another revision replaces the requested one (`work::decide_request`).

use crate::capabilities::capability_status;
use crate::error::DomainError;
use crate::events::{Event, OperationCreated, OperationTarget};
use crate::ids::{MediaId, OperationId, RegionId};
use crate::kinds::{complete_inputs, undeclared, unmet_need, BlockedOn, KindDeclaration, TaskFacts};
use crate::projections::{MediaRow, ProcessingStateRow, RegionRow};
use crate::revision::compute_revision;
use crate::status::{CapabilityStatus, OperationStatus};
use crate::tasks::TargetType;
use crate::transitions::Cause;
use crate::work;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// What a task runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskTarget {
    Media(MediaId),
    Region(RegionId),
}

impl TaskTarget {
    pub fn target_type(self) -> TargetType {
        match self {
            TaskTarget::Media(_) => TargetType::Media,
            TaskTarget::Region(_) => TargetType::Region,
        }
    }

    /// The media item's or region's id.
    pub fn id(self) -> uuid::Uuid {
        match self {
            TaskTarget::Media(id) => id.0,
            TaskTarget::Region(id) => id.0,
        }
    }
}

/// A request for a task kind on a target at the revision its inputs
/// determine.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRequest {
    pub target: TaskTarget,
    pub kind: String,
    /// The caller's inputs; what the target provides is filled in.
    pub inputs: Value,
    /// Higher runs first.
    pub priority: i32,
}

/// A request ready to decide: the caller's request, the id a new task
/// operation would get, and why the task cannot run where it was
/// requested (a tool or decoder this installation lacks), if it cannot:
/// such a task is recorded `blocked` with that reason instead of queued.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedRequest {
    pub request: TaskRequest,
    pub new_operation_id: OperationId,
    pub unavailable: Option<String>,
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

/// Events for one task operation's stream.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskEvents {
    pub operation_id: OperationId,
    /// The stream's version the events follow; `None` for a new stream.
    pub after_version: Option<i64>,
    pub events: Vec<Event>,
}

/// One request's answer and the events that carry it out (none for a
/// no-op).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestDecision {
    pub outcome: RequestOutcome,
    pub events: Option<TaskEvents>,
}

/// What a batch of requests is decided against, as loaded in the
/// transaction that appends the decisions.
#[derive(Debug, Clone, Default)]
pub struct RequestState {
    /// The declared kinds the batch names, by name.
    pub kinds: BTreeMap<String, KindDeclaration>,
    /// Every declared kind's name, for a refusal of an undeclared one to
    /// list them (loaded only when a request names an undeclared kind).
    pub declared: Vec<String>,
    pub media: BTreeMap<MediaId, MediaRow>,
    pub regions: BTreeMap<RegionId, RegionRow>,
    /// The tasks the targets already have, by (target id, kind).
    pub tasks: BTreeMap<(uuid::Uuid, String), ProcessingStateRow>,
    /// The items' capabilities (loaded when a kind of the batch has
    /// needs); the batch's own new tasks join them as they are decided.
    pub capabilities: BTreeMap<(MediaId, String), CapabilityStatus>,
}

/// Decides each request in order, each on its own: a refused request is
/// its own error and does not stop the others. Two requests of a kind on
/// one target in one batch must agree on the revision.
pub fn decide_requests(
    state: &mut RequestState,
    requests: Vec<Result<PlannedRequest, DomainError>>,
) -> Vec<Result<RequestDecision, DomainError>> {
    // (target, kind) → (operation, revision) decided in this batch.
    let mut decided: BTreeMap<(uuid::Uuid, String), (OperationId, String)> = BTreeMap::new();
    requests
        .into_iter()
        .map(|planned| {
            let (slot, decision) = decide_one(state, &decided, planned?)?;
            let revision = decision.outcome.requested_revision.clone();
            decided.insert(slot, (decision.outcome.operation_id, revision));
            Ok(decision)
        })
        .collect()
}

/// One request's decision, with the batch slot it fills.
fn decide_one(
    state: &mut RequestState,
    decided: &BTreeMap<(uuid::Uuid, String), (OperationId, String)>,
    planned: PlannedRequest,
) -> Result<((uuid::Uuid, String), RequestDecision), DomainError> {
    let PlannedRequest {
        request,
        new_operation_id,
        unavailable,
    } = planned;
    let kind = state
        .kinds
        .get(&request.kind)
        .ok_or_else(|| undeclared(&request.kind, &state.declared))?
        .clone();
    if kind.target != request.target.target_type() {
        return Err(DomainError::InvalidInput(format!(
            "task kind {} runs on {} targets, not on a {}",
            kind.name,
            kind.target,
            request.target.target_type()
        )));
    }
    let (media_id, region_id, target_values) = target_values_of(request.target, &state.media, &state.regions)?;
    let inputs = Value::Object(complete_inputs(&kind, &request.inputs, &target_values)?);
    let revision = compute_revision(&kind.name, &kind.version, &inputs)
        .map_err(|error| DomainError::InvalidInput(format!("{} inputs: {error}", kind.name)))?;
    let media_kind = state
        .media
        .get(&media_id)
        .map(|item| item.media_kind.clone())
        .unwrap_or_default();
    let slot = (request.target.id(), kind.name.clone());
    if let Some((operation_id, earlier)) = decided.get(&slot) {
        if *earlier != revision {
            return Err(DomainError::InvalidInput(format!(
                "this batch requests {} on {} twice with different inputs",
                kind.name,
                request.target.id()
            )));
        }
        let outcome = RequestOutcome {
            operation_id: *operation_id,
            requested_revision: revision,
            created: false,
            status: OperationStatus::Queued,
        };
        return Ok((slot, RequestDecision { outcome, events: None }));
    }
    let asked = Asked {
        kind: &kind,
        media_id,
        media_kind: &media_kind,
        revision,
        inputs,
        unavailable,
    };
    let decision = match state.tasks.get(&slot) {
        Some(task) => decide_existing(task, asked, &state.capabilities),
        None => {
            let target = OperationTarget {
                media_id: Some(media_id),
                region_id,
                path: None,
            };
            decide_new(
                new_operation_id,
                target,
                request.priority,
                asked,
                &mut state.capabilities,
            )
        }
    };
    Ok((slot, decision))
}

/// A request as checked against its kind and target.
struct Asked<'a> {
    kind: &'a KindDeclaration,
    media_id: MediaId,
    media_kind: &'a str,
    revision: String,
    inputs: Value,
    unavailable: Option<String>,
}

/// A request of a kind the target already has a task of.
fn decide_existing(
    task: &ProcessingStateRow,
    asked: Asked<'_>,
    capabilities: &BTreeMap<(MediaId, String), CapabilityStatus>,
) -> RequestDecision {
    let Asked {
        kind,
        media_id,
        media_kind,
        revision,
        inputs,
        unavailable,
    } = asked;
    let unchanged = |revision: String| RequestDecision {
        outcome: RequestOutcome {
            operation_id: task.operation_id,
            requested_revision: revision,
            created: false,
            status: task.status,
        },
        events: None,
    };
    // A kind that does not apply to the item stays so at any revision: a
    // new digest does not make a video an image.
    if task.status == OperationStatus::NotApplicable && !kind.applies_to(media_kind) {
        return unchanged(revision);
    }
    let Some(event) = work::decide_request(task, &revision, inputs, &kind.version) else {
        return unchanged(revision);
    };
    let requeued = matches!(&event, Event::OperationRevisionRequested(requested) if requested.requeue);
    let waiting = requeued || !matches!(task.status, OperationStatus::Leased | OperationStatus::Running);
    let mut events = vec![event];
    // The item's new content is of a kind this task does not apply to (a
    // photo replaced by a sound): it is recorded so at the new revision
    // instead of running on content it cannot read. A task a worker holds
    // is left to its worker's answer.
    if !kind.applies_to(media_kind) && waiting {
        events.extend(Event::for_reason(
            Cause::MarkNotApplicable,
            task.operation_id,
            kind.not_applicable_reason(media_kind),
        ));
    // Work that runs again waits for its needs again, and cannot run where
    // what it runs with is missing.
    } else if let Some(reason) = unavailable.filter(|_| requeued) {
        events.extend(Event::for_reason(Cause::Block, task.operation_id, reason));
    } else if let Some(need) = requeued.then(|| unmet(kind, media_id, capabilities)).flatten() {
        events.push(Event::blocked_on_need(task.operation_id, need));
    }
    RequestDecision {
        outcome: RequestOutcome {
            operation_id: task.operation_id,
            requested_revision: revision,
            created: true,
            status: task.status,
        },
        events: Some(TaskEvents {
            operation_id: task.operation_id,
            after_version: Some(task.version),
            events,
        }),
    }
}

/// The first request of a kind on a target: a new task. One that does not
/// apply to the item's media kind is recorded as such and never becomes
/// claimable; one that cannot run here (what it runs with is missing) is
/// blocked with the reason; one whose needs are unmet waits, blocked,
/// until they are.
fn decide_new(
    operation_id: OperationId,
    target: OperationTarget,
    priority: i32,
    asked: Asked<'_>,
    capabilities: &mut BTreeMap<(MediaId, String), CapabilityStatus>,
) -> RequestDecision {
    let Asked {
        kind,
        media_id,
        media_kind,
        revision,
        inputs,
        unavailable,
    } = asked;
    let applies = kind.applies_to(media_kind);
    let unavailable = unavailable.filter(|_| applies);
    let blocked_on = if applies && unavailable.is_none() {
        unmet(kind, media_id, capabilities)
    } else {
        None
    };
    let status = match (applies, &unavailable, &blocked_on) {
        (false, _, _) => OperationStatus::NotApplicable,
        (true, Some(_), _) | (true, None, Some(_)) => OperationStatus::Blocked,
        (true, None, None) => OperationStatus::Queued,
    };
    let mut events = vec![Event::OperationCreated(OperationCreated {
        operation_id,
        kind: kind.name.clone(),
        target,
        revision: Some(revision.clone()),
        inputs,
        status: if status == OperationStatus::Queued {
            OperationStatus::Queued
        } else {
            OperationStatus::Pending
        },
        priority,
        task_version: Some(kind.version.clone()),
        task: Some(TaskFacts::of(kind)),
    })];
    if !applies {
        events.extend(Event::for_reason(
            Cause::MarkNotApplicable,
            operation_id,
            kind.not_applicable_reason(media_kind),
        ));
    }
    if let Some(reason) = unavailable {
        events.extend(Event::for_reason(Cause::Block, operation_id, reason));
    }
    if let Some(need) = blocked_on {
        events.push(Event::blocked_on_need(operation_id, need));
    }
    if let Some(capability) = kind.capability() {
        capabilities
            .entry((media_id, capability.to_string()))
            .or_insert(capability_status(status, false));
    }
    RequestDecision {
        outcome: RequestOutcome {
            operation_id,
            requested_revision: revision,
            created: true,
            status,
        },
        events: Some(TaskEvents {
            operation_id,
            after_version: None,
            events,
        }),
    }
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
/// digest and media kind; for a region also its box and revision.
/// NotFound for a target the batch's reads did not find.
fn target_values_of(
    target: TaskTarget,
    media: &BTreeMap<MediaId, MediaRow>,
    regions: &BTreeMap<RegionId, RegionRow>,
) -> Result<TargetValues, DomainError> {
    let (media_id, region) = match target {
        TaskTarget::Media(media_id) => (media_id, None),
        TaskTarget::Region(region_id) => {
            let region = regions.get(&region_id).ok_or_else(|| DomainError::NotFound {
                what: "region",
                id: region_id.to_string(),
            })?;
            (region.media_id, Some(region))
        }
    };
    let item = media.get(&media_id).ok_or_else(|| DomainError::NotFound {
        what: "media",
        id: media_id.to_string(),
    })?;
    Ok((
        media_id,
        region.map(|region| region.region_id),
        target_values(item, region),
    ))
}

/// The inputs a target provides: the media item's digest and media kind;
/// for a region (on that item) also its box and revision.
pub fn target_values(item: &MediaRow, region: Option<&RegionRow>) -> Map<String, Value> {
    let mut values = Map::new();
    if let Some(region) = region {
        values.insert(
            "bbox".to_string(),
            serde_json::json!({"x": region.x, "y": region.y, "width": region.width, "height": region.height}),
        );
        values.insert("region_revision".to_string(), Value::from(region.region_revision));
    }
    if let Some(digest) = &item.content_digest {
        values.insert("content_digest".to_string(), Value::String(digest.clone()));
    }
    values.insert("media_kind".to_string(), Value::String(item.media_kind.clone()));
    values
}

#[cfg(test)]
#[path = "requests_tests.rs"]
mod tests;
