//! What the work protocol's commands print (`opledger task ...`,
//! `opledger recover`): text for people, JSON (`--json`) for programs.

use crate::output::{clipped, print_json};
use opledger_domain::claims::fingerprint;
use opledger_domain::Timestamp;
use opledger_engine::{
    HeartbeatOutcome, Progress, RecoveryReport, RequestOutcome, TaskClaim, TaskOutcome, TaskTarget, TaskView,
};
use serde_json::{json, Value};

/// The most bytes of one stored text (an output, an error, a reason) that
/// `task show` prints in plain output.
const SHOWN_TEXT_BYTES: usize = 300;

fn time_json(at: Option<Timestamp>) -> Value {
    at.map_or(Value::Null, |at| Value::String(at.to_rfc3339()))
}

/// Stored JSON text as an embedded value (text that is not JSON stays text).
fn embedded_json(text: Option<&str>) -> Value {
    text.map_or(Value::Null, |text| {
        serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
    })
}

fn target_text(target: TaskTarget) -> String {
    match target {
        TaskTarget::Media(id) => format!("media {id}"),
        TaskTarget::Region(id) => format!("region {id}"),
    }
}

pub fn requested(outcome: &RequestOutcome, target: TaskTarget, kind: &str, as_json: bool) {
    if as_json {
        print_json(&json!({
            "operation_id": outcome.operation_id.to_string(),
            "requested_revision": outcome.requested_revision,
            "created": outcome.created,
            "status": outcome.status.as_str(),
        }));
        return;
    }
    let what = if outcome.status == opledger_domain::OperationStatus::NotApplicable {
        "not applicable to this item"
    } else if outcome.created {
        "requested"
    } else {
        "already requested (nothing changed)"
    };
    println!(
        "{kind} on {}: {what} at revision {}, operation {}",
        target_text(target),
        outcome.requested_revision,
        outcome.operation_id
    );
}

fn claim_json(claim: &TaskClaim) -> Value {
    json!({
        "claim_token": claim.claim_token,
        "operation_id": claim.operation_id.to_string(),
        "media_id": claim.media_id.map(|id| id.to_string()),
        "region_id": claim.region_id.map(|id| id.to_string()),
        "task_kind": claim.task_kind,
        "kind_version": claim.kind_version,
        "revision": claim.revision,
        "inputs": claim.inputs,
        "lease_expires_at": claim.lease_expires_at.to_rfc3339(),
        "attempt": claim.attempt,
        "path": claim.path,
        "media_kind": claim.media_kind,
        "content_digest": claim.content_digest,
    })
}

/// One claim as an object (`{"claim_token": null}` when none), or with
/// `many` every claim under `"claims"`.
pub fn claims(claims: &[TaskClaim], many: bool, as_json: bool) {
    if as_json {
        let value = if many {
            json!({ "claims": claims.iter().map(claim_json).collect::<Vec<_>>() })
        } else {
            claims
                .first()
                .map_or_else(|| json!({ "claim_token": null }), claim_json)
        };
        print_json(&value);
        return;
    }
    if claims.is_empty() {
        println!("nothing to claim");
    }
    for claim in claims {
        let target = match (claim.media_id, claim.region_id) {
            (_, Some(region)) => format!("region {region}"),
            (Some(media), None) => format!("media {media}"),
            (None, None) => "no target".to_string(),
        };
        println!(
            "claimed {} version {} on {target}: token {} until {} (operation {}, revision {}, attempt {})",
            claim.task_kind,
            claim.kind_version.as_deref().unwrap_or("?"),
            claim.claim_token,
            claim.lease_expires_at,
            claim.operation_id,
            claim.revision,
            claim.attempt
        );
    }
}

pub fn heartbeat(outcome: &HeartbeatOutcome, as_json: bool) {
    if as_json {
        print_json(&json!({
            "lease_expires_at": outcome.lease_expires_at.to_rfc3339(),
            "cancel_requested": outcome.cancel_requested,
        }));
        return;
    }
    if outcome.cancel_requested {
        println!(
            "lease held until {}; CANCEL REQUESTED: stop, remove temporary outputs, then run `opledger task ack-cancel`",
            outcome.lease_expires_at
        );
    } else {
        println!("lease held until {}", outcome.lease_expires_at);
    }
}

pub fn progress(progress: &Progress, as_json: bool) {
    if as_json {
        print_json(&json!({ "ok": true }));
        return;
    }
    match progress.total {
        Some(total) => println!("progress recorded: {} {}/{total}", progress.phase, progress.processed),
        None => println!("progress recorded: {} {}", progress.phase, progress.processed),
    }
}

pub fn completed(outcome: &TaskOutcome, as_json: bool) {
    if as_json {
        print_json(&json!({
            "operation_id": outcome.operation_id.to_string(),
            "status": outcome.status.as_str(),
            "requested_revision": outcome.requested_revision,
            "completed_revision": outcome.completed_revision,
        }));
        return;
    }
    if outcome.completed_revision.as_deref() == Some(outcome.requested_revision.as_str()) {
        println!(
            "task {} is {} at revision {}",
            outcome.operation_id, outcome.status, outcome.requested_revision
        );
    } else {
        println!(
            "task {} is {}: the result was recorded against the claimed revision; revision {} is requested now",
            outcome.operation_id, outcome.status, outcome.requested_revision
        );
    }
}

pub fn failed(outcome: &TaskOutcome, as_json: bool) {
    if as_json {
        print_json(&json!({
            "operation_id": outcome.operation_id.to_string(),
            "status": outcome.status.as_str(),
            "attempt_count": outcome.attempt_count,
            "failure_count": outcome.failure_count,
            "available_at": outcome.available_at.to_rfc3339(),
            "last_error": outcome.last_error,
        }));
        return;
    }
    let next = if outcome.status.is_terminal() {
        String::new()
    } else {
        format!(", available again at {}", outcome.available_at)
    };
    println!(
        "task {} is {} after {} attempt(s) and {} failure(s){next}",
        outcome.operation_id, outcome.status, outcome.attempt_count, outcome.failure_count
    );
}

pub fn cancelled(outcome: &TaskOutcome, as_json: bool) {
    if as_json {
        print_json(&json!({
            "operation_id": outcome.operation_id.to_string(),
            "status": outcome.status.as_str(),
            "cancel_requested": outcome.cancel_requested,
        }));
        return;
    }
    if outcome.status.is_claimed() {
        println!(
            "cancel requested for task {} ({}): its worker sees it at its next heartbeat",
            outcome.operation_id, outcome.status
        );
    } else {
        println!("task {} is {}", outcome.operation_id, outcome.status);
    }
}

pub fn released(outcome: &TaskOutcome, as_json: bool) {
    if as_json {
        print_json(&json!({
            "operation_id": outcome.operation_id.to_string(),
            "status": outcome.status.as_str(),
            "attempt_count": outcome.attempt_count,
        }));
        return;
    }
    println!("task {} is {} (claim given back)", outcome.operation_id, outcome.status);
}

pub fn cancel_acknowledged(outcome: &TaskOutcome, as_json: bool) {
    if as_json {
        print_json(&json!({
            "operation_id": outcome.operation_id.to_string(),
            "status": outcome.status.as_str(),
        }));
        return;
    }
    println!("task {} is {}", outcome.operation_id, outcome.status);
}

pub fn task(view: &TaskView, as_json: bool) {
    let state = &view.state;
    let progress = view.lease.as_ref().and_then(|lease| {
        lease.phase.as_ref().map(|phase| {
            json!({
                "phase": phase,
                "processed": lease.processed,
                "total": lease.total,
                "at": time_json(lease.progressed_at),
            })
        })
    });
    let value = json!({
        "operation_id": state.operation_id.to_string(),
        "task_kind": state.task_kind,
        "media_id": state.media_id().map(|id| id.to_string()),
        "region_id": state.region_id().map(|id| id.to_string()),
        "status": state.status.as_str(),
        "status_reason": state.status_reason,
        "priority": state.priority,
        "requested_revision": state.requested_revision,
        "completed_revision": state.completed_revision,
        "claimed_revision": state.claimed_revision,
        "inputs": embedded_json(Some(&state.inputs)),
        "output": embedded_json(state.output.as_deref()),
        "attempt_count": state.attempt_count,
        "failure_count": state.failure_count,
        "interruption_count": state.interruption_count,
        "available_at": state.available_at.to_rfc3339(),
        "last_error": state.last_error,
        "cancel_requested": state.cancel_requested,
        // A reading command: the token is the claim-taker's alone.
        "claim_token": state.claim_token.as_deref().map(fingerprint),
        "worker": state.worker,
        "claimed_at": time_json(state.claimed_at),
        "lease_expires_at": time_json(view.lease_expires_at()),
        "heartbeat_at": time_json(view.heartbeat_at()),
        "progress": progress,
        "updated_at": state.updated_at.to_rfc3339(),
    });
    if as_json {
        print_json(&value);
        return;
    }
    let target = match (state.media_id(), state.region_id()) {
        (_, Some(region)) => format!("region {region}"),
        (Some(media), None) => format!("media {media}"),
        (None, None) => state.target_id.to_string(),
    };
    println!(
        "task {} ({} on {target}): {}",
        state.operation_id, state.task_kind, state.status
    );
    if let Some(reason) = &state.status_reason {
        println!("  reason:     {}", clipped(reason, SHOWN_TEXT_BYTES));
    }
    println!("  requested:  {}", state.requested_revision);
    println!("  completed:  {}", state.completed_revision.as_deref().unwrap_or("-"));
    println!(
        "  attempts:   {} ({} failed, {} interrupted), available at {}",
        state.attempt_count, state.failure_count, state.interruption_count, state.available_at
    );
    if let Some(error) = &state.last_error {
        println!("  last error: {}", clipped(error, SHOWN_TEXT_BYTES));
    }
    if let Some(token) = &state.claim_token {
        println!(
            "  claim:      {} by {} until {}{}",
            fingerprint(token),
            state.worker.as_deref().unwrap_or("?"),
            view.lease_expires_at()
                .map_or_else(|| "-".to_string(), |at| at.to_rfc3339()),
            view.heartbeat_at()
                .map(|at| format!(", last heartbeat {at}"))
                .unwrap_or_default()
        );
    }
    if let Some(progress) = &progress {
        println!(
            "  progress:   {} {}{}",
            progress["phase"].as_str().unwrap_or(""),
            progress["processed"],
            if progress["total"].is_null() {
                String::new()
            } else {
                format!("/{}", progress["total"])
            }
        );
    }
    if state.cancel_requested {
        println!("  cancel requested");
    }
    if let Some(output) = &state.output {
        println!("  output:     {}", clipped(output, SHOWN_TEXT_BYTES));
    }
}

pub fn recovery(report: &RecoveryReport, as_json: bool) {
    if as_json {
        print_json(&json!({
            "interrupted": report.interrupted,
            "requeued": report.requeued,
            "cancelled": report.cancelled,
            "failed": report.failed,
            "skipped": report.skipped,
        }));
        return;
    }
    println!(
        "recovery: {} expired claim(s) interrupted ({} requeued, {} cancelled, {} failed), {} skipped",
        report.interrupted, report.requeued, report.cancelled, report.failed, report.skipped
    );
}
