//! Given the loaded state, when a batch of requests is decided, then each
//! answer and its events are as the rules say.

use super::*;
use crate::projections::MediaRow;
use crate::time::Timestamp;
use serde_json::json;
use uuid::Uuid;

fn at(text: &str) -> Timestamp {
    Timestamp::parse(text).unwrap()
}

fn kind(value: Value) -> KindDeclaration {
    serde_json::from_value::<KindDeclaration>(value)
        .unwrap()
        .normalized()
        .unwrap()
}

fn photo() -> MediaRow {
    MediaRow {
        media_id: MediaId(Uuid::from_u128(1)),
        path: "/library/a.jpg".into(),
        media_kind: "image".into(),
        content_digest: Some(format!("sha256:{}", "ab".repeat(32))),
        byte_size: Some(1_000),
        registered_at: at("2026-05-01T15:00:00Z"),
        updated_at: at("2026-05-01T15:00:00Z"),
        version: 1,
    }
}

/// A library with one photo and a pipeline: `thumbnail` on images,
/// `embedding` needing the thumbnail, `transcript` on sound only.
fn given() -> RequestState {
    let mut state = RequestState::default();
    for declaration in [
        kind(
            json!({"name": "thumbnail", "target": "media", "version": "1", "capability": "thumbnail",
            "applies_to": ["image"], "inputs": {"size": {"type": "integer", "default": 256}}}),
        ),
        kind(
            json!({"name": "embedding", "target": "media", "version": "1", "capability": "embedding",
            "needs": ["thumbnail"]}),
        ),
        kind(json!({"name": "transcript", "target": "media", "version": "1", "applies_to": ["audio"]})),
    ] {
        state.declared.push(declaration.name.clone());
        state.kinds.insert(declaration.name.clone(), declaration);
    }
    let item = photo();
    state.media.insert(item.media_id, item);
    state
}

fn planned(kind: &str, inputs: Value, id: u128) -> Result<PlannedRequest, DomainError> {
    Ok(PlannedRequest {
        request: TaskRequest {
            target: TaskTarget::Media(photo().media_id),
            kind: kind.into(),
            inputs,
            priority: 0,
        },
        new_operation_id: OperationId(Uuid::from_u128(id)),
        unavailable: None,
    })
}

fn event_types(decision: &RequestDecision) -> Vec<&'static str> {
    decision
        .events
        .iter()
        .flat_map(|decided| decided.events.iter().map(Event::event_type))
        .collect()
}

/// The row the fold makes of a decided new task, as a later batch loads it.
fn existing(decision: &RequestDecision, status: OperationStatus) -> ProcessingStateRow {
    let Some(Event::OperationCreated(created)) = decision.events.as_ref().and_then(|decided| decided.events.first())
    else {
        panic!("a new task starts with its creation");
    };
    ProcessingStateRow {
        operation_id: created.operation_id,
        target_type: TargetType::Media,
        target_id: photo().media_id.0,
        task_kind: created.kind.clone(),
        status,
        priority: 0,
        requested_revision: decision.outcome.requested_revision.clone(),
        inputs: created.inputs.to_string(),
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
        available_at: at("2026-05-01T15:00:00Z"),
        cancel_requested: false,
        last_error: None,
        status_reason: None,
        updated_at: at("2026-05-01T15:00:00Z"),
        version: decision
            .events
            .as_ref()
            .map_or(0, |decided| decided.events.len() as i64),
    }
}

#[test]
fn the_first_request_of_a_kind_creates_a_queued_task_on_a_new_stream() {
    let mut state = given();
    let decided = decide_requests(&mut state, vec![planned("thumbnail", json!({}), 10)]);
    let decision = decided[0].as_ref().unwrap();
    assert_eq!(decision.outcome.status, OperationStatus::Queued);
    assert!(decision.outcome.created);
    assert_eq!(event_types(decision), ["operation_created"]);
    let events = decision.events.as_ref().unwrap();
    assert_eq!(events.after_version, None, "a new task's stream is new");
    assert_eq!(events.operation_id, OperationId(Uuid::from_u128(10)));
}

#[test]
fn a_kind_that_does_not_apply_to_the_item_is_recorded_not_applicable() {
    let mut state = given();
    let decided = decide_requests(&mut state, vec![planned("transcript", json!({}), 10)]);
    let decision = decided[0].as_ref().unwrap();
    assert_eq!(decision.outcome.status, OperationStatus::NotApplicable);
    assert_eq!(event_types(decision), ["operation_created", "operation_not_applicable"]);
}

#[test]
fn a_kind_whose_need_is_requested_in_the_same_batch_waits_blocked_on_it() {
    let mut state = given();
    let decided = decide_requests(
        &mut state,
        vec![planned("thumbnail", json!({}), 10), planned("embedding", json!({}), 11)],
    );
    let embedding = decided[1].as_ref().unwrap();
    assert_eq!(embedding.outcome.status, OperationStatus::Blocked);
    assert_eq!(event_types(embedding), ["operation_created", "operation_blocked"]);
}

#[test]
fn a_task_that_cannot_run_here_is_blocked_with_the_reason() {
    let mut state = given();
    let mut request = planned("thumbnail", json!({}), 10).unwrap();
    request.unavailable = Some("no HEIF decoder in this build".into());
    let decided = decide_requests(&mut state, vec![Ok(request)]);
    let decision = decided[0].as_ref().unwrap();
    assert_eq!(decision.outcome.status, OperationStatus::Blocked);
    let Some(Event::OperationBlocked(blocked)) = decision.events.as_ref().unwrap().events.last() else {
        panic!("blocked with its reason");
    };
    assert_eq!(blocked.reason, "no HEIF decoder in this build");
}

#[test]
fn a_request_of_the_revision_already_requested_appends_nothing() {
    let mut state = given();
    let first = decide_requests(&mut state, vec![planned("thumbnail", json!({}), 10)]);
    let task = existing(first[0].as_ref().unwrap(), OperationStatus::Queued);
    state
        .tasks
        .insert((task.target_id, task.task_kind.clone()), task.clone());
    let again = decide_requests(&mut state, vec![planned("thumbnail", json!({"size": 256}), 12)]);
    let decision = again[0].as_ref().unwrap();
    assert!(!decision.outcome.created);
    assert_eq!(decision.outcome.operation_id, task.operation_id);
    assert_eq!(decision.events, None);
}

#[test]
fn another_revision_of_a_running_task_is_requested_without_taking_it_from_its_worker() {
    let mut state = given();
    let first = decide_requests(&mut state, vec![planned("thumbnail", json!({}), 10)]);
    let task = existing(first[0].as_ref().unwrap(), OperationStatus::Running);
    state
        .tasks
        .insert((task.target_id, task.task_kind.clone()), task.clone());
    let bigger = decide_requests(&mut state, vec![planned("thumbnail", json!({"size": 512}), 12)]);
    let decision = bigger[0].as_ref().unwrap();
    assert!(decision.outcome.created);
    assert_ne!(decision.outcome.requested_revision, task.requested_revision);
    assert_eq!(event_types(decision), ["operation_revision_requested"]);
    let Some(Event::OperationRevisionRequested(requested)) = decision.events.as_ref().unwrap().events.first() else {
        panic!("a revision request");
    };
    assert!(!requested.requeue, "the running claim finishes first");
    assert_eq!(decision.events.as_ref().unwrap().after_version, Some(task.version));
}

#[test]
fn an_undeclared_kind_is_refused_naming_the_declared_ones_and_the_rest_of_the_batch_is_decided() {
    let mut state = given();
    let decided = decide_requests(
        &mut state,
        vec![planned("captions", json!({}), 10), planned("thumbnail", json!({}), 11)],
    );
    let refused = decided[0].as_ref().unwrap_err().to_string();
    assert!(refused.contains("\"captions\" is not declared"), "{refused}");
    assert!(refused.contains("thumbnail, embedding, transcript"), "{refused}");
    assert!(decided[1].is_ok());
}

#[test]
fn one_kind_requested_twice_on_an_item_in_a_batch_must_agree_on_the_revision() {
    let mut state = given();
    let decided = decide_requests(
        &mut state,
        vec![
            planned("thumbnail", json!({}), 10),
            planned("thumbnail", json!({}), 11),
            planned("thumbnail", json!({"size": 64}), 12),
        ],
    );
    let second = decided[1].as_ref().unwrap();
    assert!(!second.outcome.created);
    assert_eq!(second.outcome.operation_id, OperationId(Uuid::from_u128(10)));
    let refused = decided[2].as_ref().unwrap_err().to_string();
    assert!(refused.contains("twice with different inputs"), "{refused}");
}

#[test]
fn a_request_on_an_item_not_loaded_is_not_found() {
    let mut state = given();
    state.media.clear();
    let decided = decide_requests(&mut state, vec![planned("thumbnail", json!({}), 10)]);
    assert!(matches!(decided[0], Err(DomainError::NotFound { what: "media", .. })));
}
