//! Pure decisions: given the current state of an operation (its projected
//! row) and what a caller asks for, the event to record or the refusal.
//! The engine loads the state, calls these, and appends what they return;
//! the rules live here, where they can be tested without a database.

use crate::error::DomainError;
use crate::events::{
    Event, OperationClaimed, OperationFailed, OperationInterrupted, OperationProgressed, OperationReason,
    OperationRetryScheduled, OperationStageChanged, OperationStarted, OperationSucceeded,
};
use crate::projections::OperationRow;
use crate::projections::INGESTION_FILE;
use crate::status::IngestionStage;
use crate::time::Timestamp;
use crate::transitions::{self, Cause};
use serde_json::Value;

/// What a caller asks an operation to do.
#[derive(Debug, Clone, PartialEq)]
pub enum OperationCommand {
    /// A cause whose event carries only a reason (enqueue, block, skip, ...).
    Transition {
        cause: Cause,
        reason: String,
    },
    Claim {
        claim_token: String,
        worker: String,
        lease_expires_at: Timestamp,
    },
    Start {
        claim_token: String,
    },
    Progress {
        claim_token: String,
        phase: String,
        processed: i64,
        total: Option<i64>,
    },
    ChangeStage {
        stage: IngestionStage,
    },
    Succeed {
        claim_token: String,
        output: Value,
    },
    Fail {
        claim_token: String,
        error: String,
        retryable: bool,
    },
    ScheduleRetry {
        available_at: Timestamp,
        backoff_ms: i64,
        jitter_ms: i64,
    },
    Interrupt {
        reason: String,
    },
    RequestCancel {
        reason: String,
    },
}

fn require_claim(row: &OperationRow, claim_token: &str) -> Result<(), DomainError> {
    if row.claim_token.as_deref() == Some(claim_token) {
        Ok(())
    } else {
        Err(DomainError::Conflict(format!(
            "claim token {claim_token} does not hold operation {} (it is {}{})",
            row.operation_id,
            row.status,
            row.claim_token
                .as_deref()
                .map(|current| format!(", claimed by another token {current}"))
                .unwrap_or_default()
        )))
    }
}

/// Decides the event for `command` on the operation in `row`.
pub fn decide_operation(row: &OperationRow, command: OperationCommand) -> Result<Event, DomainError> {
    let operation_id = row.operation_id;
    let check = |cause: Cause| transitions::transition(row.status, cause).map(|_| ());
    Ok(match command {
        OperationCommand::Transition { cause, reason } => {
            check(cause)?;
            Event::for_reason(cause, operation_id, reason).ok_or_else(|| {
                DomainError::InvalidInput(format!("{cause} needs its own command (it records more than a reason)"))
            })?
        }
        OperationCommand::Claim {
            claim_token,
            worker,
            lease_expires_at,
        } => {
            check(Cause::Claim)?;
            if claim_token.is_empty() || worker.is_empty() {
                return Err(DomainError::InvalidInput(
                    "a claim needs a token and a worker name".into(),
                ));
            }
            Event::OperationClaimed(OperationClaimed {
                operation_id,
                claim_token,
                worker,
                revision: row.revision.clone(),
                lease_expires_at,
            })
        }
        OperationCommand::Start { claim_token } => {
            require_claim(row, &claim_token)?;
            check(Cause::Start)?;
            Event::OperationStarted(OperationStarted {
                operation_id,
                claim_token,
            })
        }
        OperationCommand::Progress {
            claim_token,
            phase,
            processed,
            total,
        } => {
            require_claim(row, &claim_token)?;
            if processed < 0 || total.is_some_and(|total| total < 0) {
                return Err(DomainError::InvalidInput("progress counts cannot be negative".into()));
            }
            if phase.is_empty() {
                return Err(DomainError::InvalidInput("progress needs a phase".into()));
            }
            Event::OperationProgressed(OperationProgressed {
                operation_id,
                phase,
                processed,
                total,
            })
        }
        OperationCommand::ChangeStage { stage } => {
            if row.kind != INGESTION_FILE {
                return Err(DomainError::InvalidInput(format!(
                    "{} operations have no stage",
                    row.kind
                )));
            }
            if let Some(current) = row.stage {
                if stage.rank() <= current.rank() {
                    return Err(DomainError::Conflict(format!(
                        "stage cannot go from {current} to {stage}"
                    )));
                }
            }
            Event::OperationStageChanged(OperationStageChanged {
                operation_id,
                stage,
                inputs: None,
            })
        }
        OperationCommand::Succeed { claim_token, output } => {
            require_claim(row, &claim_token)?;
            check(Cause::Succeed)?;
            Event::OperationSucceeded(OperationSucceeded {
                operation_id,
                claim_token: Some(claim_token),
                output,
            })
        }
        OperationCommand::Fail {
            claim_token,
            error,
            retryable,
        } => {
            require_claim(row, &claim_token)?;
            check(if retryable {
                Cause::FailRetryable
            } else {
                Cause::FailTerminal
            })?;
            Event::OperationFailed(OperationFailed {
                operation_id,
                claim_token: Some(claim_token),
                error,
                retryable,
            })
        }
        OperationCommand::ScheduleRetry {
            available_at,
            backoff_ms,
            jitter_ms,
        } => {
            check(Cause::ScheduleRetry)?;
            if backoff_ms < 0 || jitter_ms < 0 {
                return Err(DomainError::InvalidInput(
                    "backoff and jitter cannot be negative".into(),
                ));
            }
            Event::OperationRetryScheduled(OperationRetryScheduled {
                operation_id,
                available_at,
                backoff_ms,
                jitter_ms,
            })
        }
        OperationCommand::Interrupt { reason } => {
            check(Cause::Interrupt)?;
            Event::OperationInterrupted(OperationInterrupted {
                operation_id,
                claim_token: row.claim_token.clone(),
                reason,
            })
        }
        OperationCommand::RequestCancel { reason } => {
            if row.status.is_terminal() {
                return Err(DomainError::Conflict(format!(
                    "operation {operation_id} is {} and cannot be cancelled",
                    row.status
                )));
            }
            Event::OperationCancelRequested(OperationReason { operation_id, reason })
        }
    })
}
