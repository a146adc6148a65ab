//! Given a task and its kind's declaration, when the kind's version moves
//! on, then the task is re-targeted, blocked or left as the rules say.

use super::*;
use crate::ids::{MediaId, OperationId};
use crate::tasks::TargetType;
use crate::time::Timestamp;
use serde_json::json;
use uuid::Uuid;

fn embedding(version: &str, inputs: Value) -> KindDeclaration {
    serde_json::from_value::<KindDeclaration>(json!({
        "name": "embedding", "target": "media", "version": version, "inputs": inputs
    }))
    .unwrap()
    .normalized()
    .unwrap()
}

fn values() -> Map<String, Value> {
    let mut values = Map::new();
    values.insert("content_digest".into(), json!(format!("sha256:{}", "cd".repeat(32))));
    values.insert("media_kind".into(), json!("image"));
    values
}

/// A task of `embedding` requested at version 1 with `inputs`, in `status`.
fn task(status: OperationStatus, inputs: Value) -> ProcessingStateRow {
    let at = Timestamp::parse("2026-12-08T10:00:00Z").unwrap();
    ProcessingStateRow {
        operation_id: OperationId(Uuid::from_u128(7)),
        target_type: TargetType::Media,
        target_id: MediaId(Uuid::from_u128(1)).0,
        task_kind: "embedding".into(),
        status,
        priority: 0,
        requested_revision: "r1".into(),
        inputs: inputs.to_string(),
        task_version: Some("1".into()),
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
        available_at: at,
        cancel_requested: false,
        last_error: None,
        status_reason: None,
        updated_at: at,
        version: 3,
    }
}

#[test]
fn a_queued_task_is_requested_again_at_the_new_version_and_keeps_its_place() {
    let v2 = embedding("2", json!({"model": {"type": "string", "default": "clip"}}));
    let waiting = task(
        OperationStatus::Queued,
        json!({"model": "siglip", "content_digest": values()["content_digest"], "media_kind": "image"}),
    );
    let Some(Event::OperationRevisionRequested(requested)) = decide_version_change(&v2, &waiting, &values()) else {
        panic!("a queued task behind its kind's version is re-targeted");
    };
    assert_eq!(requested.task_version.as_deref(), Some("2"));
    assert_eq!(requested.reason.as_deref(), Some(VERSION_CHANGED));
    assert!(!requested.requeue, "the task keeps its place in the queue");
    assert_eq!(
        requested.inputs["model"],
        json!("siglip"),
        "what it was asked with is kept"
    );
    assert_eq!(
        requested.revision,
        compute_revision("embedding", "2", &requested.inputs).unwrap(),
        "the revision is the new version's"
    );
}

#[test]
fn every_waiting_status_is_re_targeted_and_no_held_or_settled_one_is() {
    let v2 = embedding("2", json!({}));
    for status in OperationStatus::ALL.iter().copied() {
        let decided = decide_version_change(&v2, &task(status, json!({})), &values());
        assert_eq!(
            decided.is_some(),
            WAITING_STATUSES.contains(&status),
            "{status}: only work nobody holds and nothing settled is re-targeted"
        );
    }
}

#[test]
fn a_task_at_the_current_version_or_of_unknown_version_is_left_alone() {
    let v1 = embedding("1", json!({}));
    assert_eq!(
        decide_version_change(&v1, &task(OperationStatus::Queued, json!({})), &values()),
        None
    );
    let mut unknown = task(OperationStatus::Queued, json!({}));
    unknown.task_version = None;
    assert_eq!(
        decide_version_change(&embedding("2", json!({})), &unknown, &values()),
        None
    );
}

#[test]
fn inputs_the_new_version_no_longer_takes_are_dropped_and_its_defaults_filled_in() {
    let v2 = embedding("2", json!({"size": {"type": "integer", "default": 512}}));
    let waiting = task(OperationStatus::Queued, json!({"model": "clip"}));
    let Some(Event::OperationRevisionRequested(requested)) = decide_version_change(&v2, &waiting, &values()) else {
        panic!("re-targeted");
    };
    assert_eq!(requested.inputs.get("model"), None);
    assert_eq!(requested.inputs["size"], json!(512));
    assert_eq!(
        requested.inputs["content_digest"],
        values()["content_digest"],
        "the target's values are filled afresh"
    );
}

#[test]
fn a_task_the_new_version_cannot_run_is_blocked_with_the_reason_instead_of_running_at_the_old_one() {
    let v2 = embedding("2", json!({"prompt": {"type": "string", "required": true}}));
    let Some(Event::OperationBlocked(blocked)) =
        decide_version_change(&v2, &task(OperationStatus::Queued, json!({})), &values())
    else {
        panic!("blocked");
    };
    assert!(
        blocked.reason.starts_with("version_changed: version 2 of embedding"),
        "{}",
        blocked.reason
    );
    assert!(blocked.reason.contains("prompt"), "{}", blocked.reason);
}

#[test]
fn stated_versions_must_name_a_claimed_kind_and_be_printable() {
    let kinds = vec!["embedding".to_string()];
    let stated = |kind: &str, versions: &[&str]| {
        BTreeMap::from([(
            kind.to_string(),
            versions.iter().map(ToString::to_string).collect::<BTreeSet<_>>(),
        )])
    };
    assert!(check_stated_versions(&kinds, &stated("embedding", &["2", "2.1"])).is_ok());
    assert!(check_stated_versions(&kinds, &BTreeMap::new()).is_ok());
    let refused = check_stated_versions(&kinds, &stated("thumbnail", &["1"])).unwrap_err();
    assert!(refused.to_string().contains("does not name"), "{refused}");
    assert!(check_stated_versions(&kinds, &stated("embedding", &[])).is_err());
    assert!(check_stated_versions(&kinds, &stated("embedding", &["bad\nversion"])).is_err());
    assert!(check_stated_versions(&kinds, &stated("embedding", &[&"9".repeat(65)])).is_err());
}
