//! The work protocol's decisions, as pure functions of a processing state.
//!
//! The engine loads a task's processing-state row inside the write
//! transaction, asks one of these functions what to record, and appends the
//! events it returns. Every decision that depends on time or chance takes
//! them as arguments (`now`, a jitter draw), and records them in the events,
//! so replay folds the same values instead of deciding again.
//!
//! Fencing: a worker's report names its claim token (and, from the library,
//! the revision it claimed). It is accepted only while that claim holds the
//! task; otherwise it is a conflict and nothing is recorded. Each decision
//! about a held claim ([`decide_report`], [`decide_heartbeat`],
//! [`decide_progress`]) checks the fence itself, first, so no caller can
//! decide on a claim it no longer holds.

use crate::error::DomainError;
use crate::events::{
    Event, OperationClaimed, OperationFailed, OperationInterrupted, OperationProgressed, OperationReason,
    OperationReleased, OperationRetryScheduled, OperationRevisionRequested, OperationSucceeded, OperationSuperseded,
};
use crate::lease::LeaseMs;
use crate::projections::ProcessingStateRow;
use crate::tasks::{Exhausted, RetryPolicy, CLAIMABLE_STATUSES};
use crate::time::Timestamp;
use crate::transitions::{self, Cause};
use serde_json::Value;

/// What a worker presents to prove it still holds a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub claim_token: String,
    /// The revision the worker claimed; checked when given.
    pub revision: Option<String>,
}

impl Fence {
    pub fn token(claim_token: impl Into<String>) -> Self {
        Fence {
            claim_token: claim_token.into(),
            revision: None,
        }
    }
}

/// How a worker finished.
#[derive(Debug, Clone, PartialEq)]
pub enum Completion {
    /// It produced this output.
    Output(Value),
    /// It ran and found nothing to produce (an optional output).
    NoResult { reason: String },
}

/// How a worker ended one claim.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOutcome {
    /// Finished: an output, or no result.
    Complete(Completion),
    /// Failed: retried with backoff while attempts remain unless `terminal`.
    Fail { error: String, terminal: bool },
    /// Stopped after a cancel request, its temporary outputs removed.
    AcknowledgeCancel,
    /// Given back unused, for this reason: queued again at once, counted
    /// neither as an attempt nor as a failure.
    Release { reason: String },
}

/// Refuses a report whose claim no longer holds the task. The decisions
/// below apply it; a read that answers for a claim (is it still standing?)
/// applies it too.
pub fn check_fence(row: &ProcessingStateRow, fence: &Fence) -> Result<(), DomainError> {
    if row.claim_token.as_deref() != Some(fence.claim_token.as_str()) {
        return Err(DomainError::Conflict(format!(
            "claim {} no longer holds task {} ({} on {}): it is {}{}",
            fence.claim_token,
            row.operation_id,
            row.task_kind,
            row.target_id,
            row.status,
            row.claim_token
                .as_deref()
                .map(|holder| format!(", held by claim {holder}"))
                .unwrap_or_default()
        )));
    }
    if let Some(revision) = &fence.revision {
        if row.claimed_revision.as_deref() != Some(revision.as_str()) {
            return Err(DomainError::Conflict(format!(
                "claim {} runs revision {}, not {revision}",
                fence.claim_token,
                row.claimed_revision.as_deref().unwrap_or("none")
            )));
        }
    }
    Ok(())
}

/// A request for `revision` on an existing task: `None` when that revision
/// is already the requested one (completed or on its way), else the event
/// that records the new request.
pub fn decide_request(row: &ProcessingStateRow, revision: &str, inputs: Value, task_version: &str) -> Option<Event> {
    if row.requested_revision == revision {
        return None;
    }
    let requeue = transitions::transition(row.status, Cause::Request).is_ok();
    Some(Event::OperationRevisionRequested(OperationRevisionRequested {
        operation_id: row.operation_id,
        revision: revision.to_string(),
        inputs,
        requeue,
        task_version: Some(task_version.to_string()),
        reason: None,
    }))
}

/// Whether a worker may claim the task at `now`.
pub fn is_claimable(row: &ProcessingStateRow, now: Timestamp) -> bool {
    CLAIMABLE_STATUSES.contains(&row.status) && row.available_at <= now && !row.cancel_requested
}

/// A claim of the requested revision with a fresh token.
pub fn decide_claim(
    row: &ProcessingStateRow,
    claim_token: String,
    worker: String,
    now: Timestamp,
    lease_expires_at: Timestamp,
) -> Result<Event, DomainError> {
    claim_of(row, claim_token, worker, now, lease_expires_at).map(Event::OperationClaimed)
}

fn claim_of(
    row: &ProcessingStateRow,
    claim_token: String,
    worker: String,
    now: Timestamp,
    lease_expires_at: Timestamp,
) -> Result<OperationClaimed, DomainError> {
    transitions::transition(row.status, Cause::Claim)?;
    if !is_claimable(row, now) {
        return Err(DomainError::Conflict(format!(
            "task {} is not claimable until {}",
            row.operation_id, row.available_at
        )));
    }
    if claim_token.is_empty() {
        return Err(DomainError::InvalidInput("a claim needs a token".into()));
    }
    check_worker_name(&worker)?;
    Ok(OperationClaimed {
        operation_id: row.operation_id,
        claim_token,
        worker,
        revision: Some(row.requested_revision.clone()),
        lease_expires_at,
    })
}

/// The claims a worker takes of the tasks a store offered: each task
/// the rules let it claim at `now`, with the next of `tokens`, in the
/// order offered. A task the store offered but the rules refuse is passed
/// over, never allowed to fail the whole batch.
pub fn decide_claims(
    offered: Vec<ProcessingStateRow>,
    mut tokens: impl Iterator<Item = String>,
    worker: &str,
    now: Timestamp,
    lease_expires_at: Timestamp,
) -> Result<Vec<(ProcessingStateRow, OperationClaimed)>, DomainError> {
    let mut claims = Vec::with_capacity(offered.len());
    for row in offered.into_iter().filter(|row| is_claimable(row, now)) {
        let claim_token = tokens
            .next()
            .ok_or_else(|| DomainError::InvalidInput("a claim needs a token".into()))?;
        let claimed = claim_of(&row, claim_token, worker.to_string(), now, lease_expires_at)?;
        claims.push((row, claimed));
    }
    Ok(claims)
}

/// The claim's revision is no longer the requested one.
fn superseded(row: &ProcessingStateRow) -> bool {
    row.claimed_revision.as_deref() != Some(row.requested_revision.as_str())
}

/// A worker's report of how its claim ended: refused as a conflict unless
/// the claim still holds the task, else the events that record it. `now`
/// and `jitter_draw` are used by a retryable failure only: its retry is
/// due after a backoff from `now`, plus the jitter the draw picks, as the
/// kind's declared `policy` says.
pub fn decide_report(
    row: &ProcessingStateRow,
    fence: &Fence,
    outcome: ClaimOutcome,
    policy: &RetryPolicy,
    now: Timestamp,
    jitter_draw: u32,
) -> Result<Vec<Event>, DomainError> {
    check_fence(row, fence)?;
    let claim_token = fence.claim_token.as_str();
    match outcome {
        ClaimOutcome::Complete(completion) => complete(row, claim_token, completion),
        ClaimOutcome::Fail { error, terminal } => fail(row, claim_token, &error, terminal, policy, now, jitter_draw),
        ClaimOutcome::AcknowledgeCancel => acknowledge_cancel(row).map(|event| vec![event]),
        ClaimOutcome::Release { reason } => release(row, claim_token, &reason),
    }
}

/// The reason a release records when its worker gave none.
pub const RELEASE_REASON: &str = "released by its worker";

/// A worker gives its claim back unused: the task is queued again at once
/// (for the requested revision, whichever one the claim ran). A cancel
/// requested meanwhile is finished instead, as for any claim that ends
/// without an outcome.
fn release(row: &ProcessingStateRow, claim_token: &str, reason: &str) -> Result<Vec<Event>, DomainError> {
    transitions::transition(row.status, Cause::Release)?;
    let reason = if reason.trim().is_empty() {
        RELEASE_REASON
    } else {
        reason
    };
    Ok(finish_cancel(
        row,
        vec![Event::OperationReleased(OperationReleased {
            operation_id: row.operation_id,
            claim_token: claim_token.to_string(),
            reason: reason.to_string(),
        })],
    ))
}

/// A heartbeat of a held claim: when its lease ends after it, the claim's
/// current end (`lease_ends`) extended to `now` plus `lease`, or plus the
/// length of the lease the claim took; never shortened.
pub fn decide_heartbeat(
    row: &ProcessingStateRow,
    fence: &Fence,
    now: Timestamp,
    lease: Option<LeaseMs>,
    lease_ends: Timestamp,
) -> Result<Timestamp, DomainError> {
    check_fence(row, fence)?;
    let millis = match lease {
        Some(lease) => lease.millis(),
        None => match (row.claimed_at, row.lease_expires_at) {
            (Some(claimed_at), Some(expires)) => (expires.as_micros() - claimed_at.as_micros()).max(1_000) / 1_000,
            _ => 60_000,
        },
    };
    Ok(lease_ends.max(now.plus_millis(millis)))
}

/// A progress report of a held claim: a phase other than the one last
/// reported (`reported_phase`) is an event on the timeline; counters
/// within a phase are liveness, recorded by the caller, so `None`.
pub fn decide_progress(
    row: &ProcessingStateRow,
    fence: &Fence,
    reported_phase: Option<&str>,
    phase: &str,
    processed: i64,
    total: Option<i64>,
) -> Result<Option<Event>, DomainError> {
    check_fence(row, fence)?;
    Ok((reported_phase != Some(phase)).then(|| {
        Event::OperationProgressed(OperationProgressed {
            operation_id: row.operation_id,
            phase: phase.to_string(),
            processed,
            total,
        })
    }))
}

/// A worker's completion. If the requested revision changed while it ran,
/// the outcome is recorded against the revision it claimed and the task
/// goes back to the queue for the requested one, never to done.
fn complete(row: &ProcessingStateRow, claim_token: &str, completion: Completion) -> Result<Vec<Event>, DomainError> {
    let operation_id = row.operation_id;
    if let Completion::Output(output) = &completion {
        check_output(output)?;
    }
    if superseded(row) {
        let (outcome, output) = match completion {
            Completion::Output(output) => ("succeeded", output),
            Completion::NoResult { .. } => ("no_result", Value::Null),
        };
        transitions::transition(row.status, Cause::Supersede)?;
        return Ok(finish_cancel(
            row,
            vec![Event::OperationSuperseded(OperationSuperseded {
                operation_id,
                claim_token: claim_token.to_string(),
                claimed_revision: row.claimed_revision.clone().unwrap_or_default(),
                requested_revision: row.requested_revision.clone(),
                outcome: outcome.to_string(),
                output,
                error: None,
            })],
        ));
    }
    Ok(vec![match completion {
        Completion::Output(output) => {
            transitions::transition(row.status, Cause::Succeed)?;
            Event::OperationSucceeded(OperationSucceeded {
                operation_id,
                claim_token: Some(claim_token.to_string()),
                output,
            })
        }
        Completion::NoResult { reason } => {
            transitions::transition(row.status, Cause::FindNothing)?;
            Event::OperationFoundNothing(OperationReason { operation_id, reason })
        }
    }])
}

/// An output is a JSON object (or absent: null), whatever surface it came
/// through: readers and projections look fields up in it.
pub fn check_output(output: &Value) -> Result<(), DomainError> {
    let kind = match output {
        Value::Object(_) | Value::Null => return Ok(()),
        Value::Array(_) => "an array",
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
    };
    Err(DomainError::InvalidInput(format!(
        "an output is a JSON object, not {kind}"
    )))
}

/// The longest worker name a claim records, in bytes.
pub const MAX_WORKER_NAME_BYTES: usize = 200;

/// A worker name is 1 to [`MAX_WORKER_NAME_BYTES`] bytes of printable
/// text: it is recorded on every claim and shown wherever claims are.
pub fn check_worker_name(worker: &str) -> Result<(), DomainError> {
    if worker.trim().is_empty() {
        return Err(DomainError::InvalidInput("a claim needs a worker name".into()));
    }
    if worker.len() > MAX_WORKER_NAME_BYTES || worker.chars().any(char::is_control) {
        return Err(DomainError::InvalidInput(format!(
            "a worker name is 1 to {MAX_WORKER_NAME_BYTES} bytes of printable text, not {} bytes{}",
            worker.len(),
            if worker.chars().any(char::is_control) {
                " with control characters"
            } else {
                ""
            }
        )));
    }
    Ok(())
}

/// The error a failure records: the worker's message, or a fixed one when
/// it gave none (blank), so `last_error` and the timeline never show an
/// empty reason. One rule for every path that reports a failure.
pub fn failure_message(error: &str) -> &str {
    if error.trim().is_empty() {
        "the task failed without a message"
    } else {
        error
    }
}

/// A worker's failure report. A retryable error is retried with exponential
/// backoff plus jitter until the kind's attempts run out; `jitter_draw` is a
/// uniformly drawn number in `0..=1000` that picks the jitter (per mille of
/// the largest allowed), drawn by the engine and recorded in the event.
fn fail(
    row: &ProcessingStateRow,
    claim_token: &str,
    error: &str,
    terminal: bool,
    policy: &RetryPolicy,
    now: Timestamp,
    jitter_draw: u32,
) -> Result<Vec<Event>, DomainError> {
    if error.trim().is_empty() {
        return Err(DomainError::InvalidInput("a failure needs an error text".into()));
    }
    let operation_id = row.operation_id;
    if superseded(row) {
        transitions::transition(row.status, Cause::Supersede)?;
        return Ok(finish_cancel(
            row,
            vec![Event::OperationSuperseded(OperationSuperseded {
                operation_id,
                claim_token: claim_token.to_string(),
                claimed_revision: row.claimed_revision.clone().unwrap_or_default(),
                requested_revision: row.requested_revision.clone(),
                outcome: "failed".to_string(),
                output: Value::Null,
                error: Some(error.to_string()),
            })],
        ));
    }
    let failures = u32::try_from(row.failure_count + 1).unwrap_or(u32::MAX);
    let failed = |retryable: bool, error: String| {
        Event::OperationFailed(OperationFailed {
            operation_id,
            claim_token: Some(claim_token.to_string()),
            error,
            retryable,
        })
    };
    if terminal {
        transitions::transition(row.status, Cause::FailTerminal)?;
        return Ok(vec![failed(false, error.to_string())]);
    }
    transitions::transition(row.status, Cause::FailRetryable)?;
    if failures >= policy.max_attempts {
        let summary = format!(
            "{error} (attempt {failures} of {}: no attempts left)",
            policy.max_attempts
        );
        return Ok(match policy.exhausted {
            Exhausted::FailTerminal => vec![failed(false, summary)],
            Exhausted::DeadLetter => vec![
                failed(true, error.to_string()),
                Event::OperationDeadLettered(OperationReason {
                    operation_id,
                    reason: summary,
                }),
            ],
        });
    }
    if row.cancel_requested {
        // The worker stopped: no retry is scheduled for a cancelled task.
        return Ok(finish_cancel(row, vec![failed(true, error.to_string())]));
    }
    let backoff_ms = policy.backoff_ms(failures);
    let jitter_ms = policy.max_jitter_ms(backoff_ms) * i64::from(jitter_draw.min(1_000)) / 1_000;
    Ok(vec![
        failed(true, error.to_string()),
        Event::OperationRetryScheduled(OperationRetryScheduled {
            operation_id,
            available_at: now.plus_millis(backoff_ms + jitter_ms),
            backoff_ms,
            jitter_ms,
        }),
    ])
}

/// What a cancel request records: unclaimed work is cancelled at once;
/// claimed work is asked to stop (the worker sees it at its next heartbeat)
/// and becomes `cancelled` when the worker acknowledges or recovery finds it
/// dead. An empty answer: cancellation was already requested.
pub fn decide_cancel(row: &ProcessingStateRow, reason: &str) -> Result<Vec<Event>, DomainError> {
    let operation_id = row.operation_id;
    let reason = if reason.trim().is_empty() {
        "cancel requested".to_string()
    } else {
        reason.to_string()
    };
    if row.status.is_terminal() {
        return Err(DomainError::Conflict(format!(
            "task {operation_id} is {} and cannot be cancelled",
            row.status
        )));
    }
    if row.status.is_claimed() {
        if row.cancel_requested {
            return Ok(Vec::new());
        }
        return Ok(vec![Event::OperationCancelRequested(OperationReason {
            operation_id,
            reason,
        })]);
    }
    transitions::transition(row.status, Cause::Cancel)?;
    Ok(vec![Event::OperationCancelled(OperationReason {
        operation_id,
        reason,
    })])
}

/// A claim that ends without a final outcome (a retryable failure, a
/// superseded revision, a release) while a cancel is pending finishes the cancel, as
/// recovery does for a dead worker: otherwise the task would wait in the
/// queue with `cancel_requested` set, where no claim may take it.
fn finish_cancel(row: &ProcessingStateRow, mut events: Vec<Event>) -> Vec<Event> {
    if row.cancel_requested {
        events.push(Event::OperationCancelled(OperationReason {
            operation_id: row.operation_id,
            reason: "cancelled: the worker stopped without acknowledging the cancel request".to_string(),
        }));
    }
    events
}

/// The worker stopped after a cancel request and removed its temporary
/// outputs.
fn acknowledge_cancel(row: &ProcessingStateRow) -> Result<Event, DomainError> {
    if !row.cancel_requested {
        return Err(DomainError::Conflict(format!(
            "task {} has no cancel request to acknowledge; report a failure instead",
            row.operation_id
        )));
    }
    transitions::transition(row.status, Cause::Cancel)?;
    Ok(Event::OperationCancelled(OperationReason {
        operation_id: row.operation_id,
        reason: "cancelled: the worker stopped and cleaned up".to_string(),
    }))
}

/// Recovery found the claim's lease expired at `lease_expired_at`: the claim
/// is interrupted, then the task is cancelled (if that was asked),
/// quarantined (interrupted too often), failed (kinds that must not re-run
/// on their own) or requeued.
pub fn decide_interrupt(
    row: &ProcessingStateRow,
    policy: &RetryPolicy,
    lease_expired_at: Timestamp,
) -> Result<Vec<Event>, DomainError> {
    decide_interrupt_because(row, policy, &format!("lease expired at {lease_expired_at}"))
}

/// The claim is interrupted because of `cause` (a lease that expired, a
/// holder known to be gone, a holder that stopped), with what follows as in
/// [`decide_interrupt`]. Counted as an interruption like any other.
pub fn decide_interrupt_because(
    row: &ProcessingStateRow,
    policy: &RetryPolicy,
    cause: &str,
) -> Result<Vec<Event>, DomainError> {
    let operation_id = row.operation_id;
    transitions::transition(row.status, Cause::Interrupt)?;
    // The fold counts the interruption only against the revision the claim
    // ran; a superseded claim's does not count against the requested one.
    let interruptions = row.interruption_count + i64::from(!superseded(row));
    let interrupted = Event::OperationInterrupted(OperationInterrupted {
        operation_id,
        claim_token: row.claim_token.clone(),
        reason: format!(
            "{cause} (worker {}, interruption {interruptions})",
            row.worker.as_deref().unwrap_or("unknown")
        ),
    });
    let next = if row.cancel_requested {
        Event::OperationCancelled(OperationReason {
            operation_id,
            reason: "cancelled: the worker died before acknowledging; finished by recovery".to_string(),
        })
    } else if interruptions > i64::from(policy.max_interruptions) {
        Event::OperationFailed(OperationFailed {
            operation_id,
            claim_token: None,
            error: format!(
                "quarantined: interrupted {interruptions} times (the budget is {})",
                policy.max_interruptions
            ),
            retryable: false,
        })
    } else if !policy.requeue_after_interruption {
        Event::OperationFailed(OperationFailed {
            operation_id,
            claim_token: None,
            error: format!("interrupted; {} does not re-run automatically", row.task_kind),
            retryable: false,
        })
    } else {
        Event::OperationRequeued(OperationReason {
            operation_id,
            reason: format!("requeued after interruption {interruptions}"),
        })
    };
    Ok(vec![interrupted, next])
}
