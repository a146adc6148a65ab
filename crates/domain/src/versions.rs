//! Versions in the work protocol. A task's revision is computed at a
//! version of its kind (`task_version`); a worker states the versions its
//! code implements and is offered only tasks requested at one of them; a
//! task that waits (nobody holds it) while its kind has a new version is
//! requested again at that version, recorded with reason
//! [`VERSION_CHANGED`], so nothing queued runs at a version no longer
//! current. A task a worker holds finishes at the version it claimed, and
//! its result then reads `stale` (the capability keeps the version the
//! claim ran, never the declaration's).

use crate::error::DomainError;
use crate::events::{Event, OperationBlocked, OperationRevisionRequested};
use crate::kinds::{complete_inputs, KindDeclaration, MAX_NAME_LEN};
use crate::projections::ProcessingStateRow;
use crate::quote::quote;
use crate::revision::compute_revision;
use crate::status::OperationStatus;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// The reason a waiting task is requested again at its kind's new version.
pub const VERSION_CHANGED: &str = "version_changed";

/// The most versions a worker may state for one kind.
pub const MAX_STATED_VERSIONS: usize = 16;

/// The statuses of a task that waits to run with nobody holding it: what a
/// new version of its kind re-targets.
pub const WAITING_STATUSES: &[OperationStatus] = &[
    OperationStatus::Pending,
    OperationStatus::Queued,
    OperationStatus::RetryWaiting,
    OperationStatus::Blocked,
];

/// Whether `task` waits at a version of its kind other than `kind`'s. A
/// task recorded before versions were (no `task_version`) is left alone:
/// its version is unknown, not different.
pub fn is_behind(kind: &KindDeclaration, task: &ProcessingStateRow) -> bool {
    WAITING_STATUSES.contains(&task.status)
        && task.task_kind == kind.name
        && task
            .task_version
            .as_deref()
            .is_some_and(|version| version != kind.version)
}

/// The event that moves a waiting task to `kind`'s current version, or
/// `None` when it is not behind. The task keeps its place (a queued task
/// stays queued, a blocked one blocked on what it waits for): only what it
/// will run changes. Its inputs are the ones it was requested with, less
/// those the new version no longer takes, completed as the new version
/// says (its defaults, the target's values in `target_values`). When they
/// cannot be (the new version needs an input the task was never given),
/// the task is blocked with the reason instead, so it never runs at the
/// old version; a request with the input it needs moves it on.
pub fn decide_version_change(
    kind: &KindDeclaration,
    task: &ProcessingStateRow,
    target_values: &Map<String, Value>,
) -> Option<Event> {
    if !is_behind(kind, task) {
        return None;
    }
    let requested: Map<String, Value> = serde_json::from_str(&task.inputs).unwrap_or_default();
    let given: Map<String, Value> = requested
        .into_iter()
        .filter(|(name, _)| kind.inputs.get(name).is_some_and(|input| !input.from_target))
        .collect();
    let retargeted = complete_inputs(kind, &Value::Object(given), target_values).and_then(|inputs| {
        let inputs = Value::Object(inputs);
        compute_revision(&kind.name, &kind.version, &inputs)
            .map(|revision| (revision, inputs))
            .map_err(|error| DomainError::InvalidInput(error.to_string()))
    });
    Some(match retargeted {
        Ok((revision, inputs)) => Event::OperationRevisionRequested(OperationRevisionRequested {
            operation_id: task.operation_id,
            revision,
            inputs,
            requeue: false,
            task_version: Some(kind.version.clone()),
            reason: Some(VERSION_CHANGED.to_string()),
        }),
        Err(error) => Event::OperationBlocked(OperationBlocked {
            operation_id: task.operation_id,
            reason: format!(
                "{VERSION_CHANGED}: version {} of {} cannot run what this task was requested with ({}); \
                 request it again with the inputs that version takes",
                kind.version,
                kind.name,
                plain(&error)
            ),
            blocked_on: None,
        }),
    })
}

/// The versions a worker states, per kind it claims: checked against the
/// kinds it names. A worker that states versions names its kinds (a
/// version means nothing without one); each version is what a declaration
/// may hold (1 to 64 printable characters), at most
/// [`MAX_STATED_VERSIONS`] per kind.
pub fn check_stated_versions(
    kinds: &[String],
    versions: &BTreeMap<String, BTreeSet<String>>,
) -> Result<(), DomainError> {
    for (kind, stated) in versions {
        if !kinds.iter().any(|named| named == kind) {
            return Err(DomainError::InvalidInput(format!(
                "versions are stated for kind {}, which the claim does not name; name it with the kinds to claim",
                quote(kind)
            )));
        }
        if stated.is_empty() || stated.len() > MAX_STATED_VERSIONS {
            return Err(DomainError::InvalidInput(format!(
                "a worker states 1 to {MAX_STATED_VERSIONS} versions of kind {}, not {}",
                quote(kind),
                stated.len()
            )));
        }
        for version in stated {
            if version.trim() != version
                || version.is_empty()
                || version.len() > MAX_NAME_LEN
                || version.chars().any(char::is_control)
            {
                return Err(DomainError::InvalidInput(format!(
                    "version {} of kind {} must be 1 to {MAX_NAME_LEN} printable characters",
                    quote(version),
                    quote(kind)
                )));
            }
        }
    }
    Ok(())
}

/// A domain refusal's message without its category prefix.
fn plain(error: &DomainError) -> String {
    match error {
        DomainError::InvalidInput(message) | DomainError::Conflict(message) => message.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
#[path = "versions_tests.rs"]
mod tests;
