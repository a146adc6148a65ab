//! Batches: a named run over a fixed set of items, with exact progress.
//!
//! What an item's settled operation status means for its batch
//! ([`settled_outcome`]), how progress is counted ([`BatchProgress`]), and
//! the one activity predicate ([`is_active`]) that the projection, the
//! status queries and the engine's completion reconciliation all use. Pure:
//! progress comes from the batch's own items, never from aggregating
//! processing states, and nothing here reads a clock.

use crate::error::DomainError;
use crate::events::{Event, OperationReason};
use crate::ids::OperationId;
use crate::kinds::BlockedOn;
use crate::status::OperationStatus;
use crate::transitions::{self, Cause};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How an item ended, as far as its batch is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemOutcome {
    /// It produced its result, or ran and found nothing to produce.
    Succeeded,
    /// It failed for good (or its source is confirmed missing): a resume
    /// runs it again.
    Failed,
    /// There was nothing to do: already up to date, a duplicate input, or
    /// not applicable to the item.
    Skipped,
    /// It was cancelled: a resume runs it again.
    Cancelled,
    /// It cannot run: a capability its kind needs ended without a result
    /// on the item (its work failed for good, found nothing, or does not
    /// apply). Only a person clearing the need lets it run, so the batch
    /// does not wait for it; the item takes its real outcome if it runs
    /// and settles later.
    Blocked,
}

impl ItemOutcome {
    pub const ALL: &'static [ItemOutcome] = &[
        ItemOutcome::Succeeded,
        ItemOutcome::Failed,
        ItemOutcome::Skipped,
        ItemOutcome::Cancelled,
        ItemOutcome::Blocked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ItemOutcome::Succeeded => "succeeded",
            ItemOutcome::Failed => "failed",
            ItemOutcome::Skipped => "skipped",
            ItemOutcome::Cancelled => "cancelled",
            ItemOutcome::Blocked => "blocked",
        }
    }

    /// Whether a resume runs an item that ended this way again.
    pub fn is_resumable(self) -> bool {
        matches!(self, ItemOutcome::Failed | ItemOutcome::Cancelled)
    }

    /// Whether a later settlement of the item's operation replaces this
    /// outcome. A block by a need is not an end of the item's own work:
    /// once a person clears the need, the work runs, and how it ends is
    /// the item's outcome. Every other outcome is final until a resume.
    pub fn is_replaced_by(self, later: ItemOutcome) -> bool {
        self == ItemOutcome::Blocked && later != ItemOutcome::Blocked
    }
}

impl fmt::Display for ItemOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ItemOutcome {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        ItemOutcome::ALL
            .iter()
            .copied()
            .find(|outcome| outcome.as_str() == text)
            .ok_or_else(|| {
                format!("{text:?} is not a batch item outcome (succeeded, failed, skipped, cancelled, blocked)")
            })
    }
}

/// The batch outcome of an operation status, if the status settles the
/// item. Waiting, running, retrying and interrupted work is not settled: a
/// long wait or an expired lease is not an outcome.
pub fn settled_outcome(status: OperationStatus) -> Option<ItemOutcome> {
    use OperationStatus as O;
    match status {
        O::Succeeded | O::NoResult => Some(ItemOutcome::Succeeded),
        O::FailedTerminal | O::DeadLettered | O::MissingConfirmed => Some(ItemOutcome::Failed),
        O::Skipped | O::NotApplicable => Some(ItemOutcome::Skipped),
        O::Cancelled => Some(ItemOutcome::Cancelled),
        O::Pending
        | O::Queued
        | O::Leased
        | O::Running
        | O::RetryWaiting
        | O::Blocked
        | O::FailedRetryable
        | O::Interrupted => None,
    }
}

/// The batch outcome of an operation as it stands: its settled status's
/// ([`settled_outcome`]), or `blocked` while it is blocked by a need whose
/// work ended without a result ([`BlockedOn::is_waiting`] is false). A
/// block that still waits for work in progress, and a block by a person
/// or caller (no need recorded), leave the item unsettled.
pub fn item_outcome(status: OperationStatus, blocked_on: Option<&BlockedOn>) -> Option<ItemOutcome> {
    match (status, blocked_on) {
        (OperationStatus::Blocked, Some(need)) if !need.is_waiting() => Some(ItemOutcome::Blocked),
        _ => settled_outcome(status),
    }
}

/// Why a file ingestion that just succeeded is a *failed* item of its
/// batches: its output names image tasks that failed for good
/// (`failures`, as `kind: reason`). The file is in the ledger, but the
/// batch was run to make of it what those tasks make, so it counts as
/// failed (with those failures as its reason), as the ingest that ran it
/// counts it. `None` for any other operation or event. Only the event
/// says so: an item settled later from its operation's status alone
/// (reconciliation, a resume) counts the success.
pub fn ingestion_failures(kind: &str, settling: &Event) -> Option<String> {
    let Event::OperationSucceeded(succeeded) = settling else {
        return None;
    };
    if kind != crate::status::INGESTION_FILE {
        return None;
    }
    let failures: Vec<&str> = succeeded
        .output
        .get("failures")?
        .as_array()?
        .iter()
        .filter_map(|failure| failure.as_str())
        .collect();
    (!failures.is_empty()).then(|| format!("image tasks failed: {}", failures.join("; ")))
}

/// Exact progress, counted from the batch's items.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BatchProgress {
    pub total: i64,
    pub settled: i64,
    pub succeeded: i64,
    pub failed: i64,
    pub skipped: i64,
    pub cancelled: i64,
    pub blocked: i64,
}

impl BatchProgress {
    pub fn remaining(&self) -> i64 {
        self.total - self.settled
    }

    /// Counts an item settling with `outcome`.
    pub fn settle(&mut self, outcome: ItemOutcome) {
        self.settled += 1;
        *self.count_of(outcome) += 1;
    }

    /// Takes back an item's settlement (the item runs again).
    pub fn unsettle(&mut self, outcome: ItemOutcome) {
        self.settled -= 1;
        *self.count_of(outcome) -= 1;
    }

    fn count_of(&mut self, outcome: ItemOutcome) -> &mut i64 {
        match outcome {
            ItemOutcome::Succeeded => &mut self.succeeded,
            ItemOutcome::Failed => &mut self.failed,
            ItemOutcome::Skipped => &mut self.skipped,
            ItemOutcome::Cancelled => &mut self.cancelled,
            ItemOutcome::Blocked => &mut self.blocked,
        }
    }
}

/// The activity predicate: a batch is active while any of its items is
/// unsettled. Its stored status is not consulted, so a status written
/// before a restart never hides outstanding work; and since only settled
/// outcomes count, a long wait or an expired lease keeps it active.
pub fn is_active(progress: &BatchProgress) -> bool {
    progress.remaining() > 0
}

/// A batch's status, derived from its progress and whether it was asked to
/// cancel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchStatus {
    Running,
    /// Cancel requested; running items were asked to stop and have not yet.
    Cancelling,
    Completed,
    /// Every item settled, some of them failed or blocked.
    CompletedWithFailures,
    Cancelled,
}

impl BatchStatus {
    pub const ALL: &'static [BatchStatus] = &[
        BatchStatus::Running,
        BatchStatus::Cancelling,
        BatchStatus::Completed,
        BatchStatus::CompletedWithFailures,
        BatchStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BatchStatus::Running => "running",
            BatchStatus::Cancelling => "cancelling",
            BatchStatus::Completed => "completed",
            BatchStatus::CompletedWithFailures => "completed_with_failures",
            BatchStatus::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for BatchStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BatchStatus {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        BatchStatus::ALL
            .iter()
            .copied()
            .find(|status| status.as_str() == text)
            .ok_or_else(|| format!("{text:?} is not a batch status"))
    }
}

/// The status of a batch with this progress.
pub fn batch_status(progress: &BatchProgress, cancel_requested: bool) -> BatchStatus {
    match (is_active(progress), cancel_requested) {
        (true, false) => BatchStatus::Running,
        (true, true) => BatchStatus::Cancelling,
        (false, true) => BatchStatus::Cancelled,
        (false, false) if progress.failed > 0 || progress.blocked > 0 => BatchStatus::CompletedWithFailures,
        (false, false) => BatchStatus::Completed,
    }
}

/// What cancelling a batch does to the operation of an item that is
/// unsettled or settled `blocked` (work that would run once its need is
/// cleared): settled work is left alone; claimed work is asked to stop (it settles as
/// cancelled when its worker acknowledges); waiting work is cancelled now.
pub fn decide_item_cancel(
    operation_id: OperationId,
    status: OperationStatus,
    cancel_requested: bool,
    reason: &str,
) -> Option<Event> {
    let payload = OperationReason {
        operation_id,
        reason: reason.to_string(),
    };
    if status.is_terminal() {
        return None;
    }
    if status.is_claimed() {
        return (!cancel_requested).then_some(Event::OperationCancelRequested(payload));
    }
    transitions::transition(status, Cause::Cancel)
        .ok()
        .map(|_| Event::OperationCancelled(payload))
}

/// What resuming a batch does to an item that ended `failed` or
/// `cancelled`: its operation is reopened (a fresh budget, back in the
/// queue). Refused when the transition table has no way back from its status.
pub fn decide_item_resume(
    operation_id: OperationId,
    status: OperationStatus,
    reason: &str,
) -> Result<Event, DomainError> {
    transitions::transition(status, Cause::Reopen)?;
    Ok(Event::OperationReopened(OperationReason {
        operation_id,
        reason: reason.to_string(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_for_good_is_exactly_the_terminal_failures_a_batch_counts_as_failed() {
        let failed: Vec<OperationStatus> = OperationStatus::ALL
            .iter()
            .copied()
            .filter(|status| status.is_failed_for_good())
            .collect();
        assert_eq!(
            failed,
            [
                OperationStatus::MissingConfirmed,
                OperationStatus::FailedTerminal,
                OperationStatus::DeadLettered
            ]
        );
        for status in OperationStatus::ALL {
            assert!(!status.is_failed_for_good() || status.is_terminal(), "{status}");
            assert_eq!(
                status.is_failed_for_good(),
                settled_outcome(*status) == Some(ItemOutcome::Failed),
                "{status}"
            );
        }
    }

    #[test]
    fn only_settled_statuses_have_an_outcome() {
        for status in OperationStatus::ALL {
            let outcome = settled_outcome(*status);
            assert_eq!(
                outcome.is_some(),
                status.is_terminal(),
                "{status}: settled exactly when terminal"
            );
        }
    }

    #[test]
    fn an_item_blocked_by_a_need_that_ended_without_a_result_is_settled_blocked() {
        use crate::status::CapabilityStatus;
        let need = |status| BlockedOn {
            capability: "thumbnail".into(),
            status: Some(status),
        };
        let stuck = need(CapabilityStatus::FailedTerminal);
        let waiting = need(CapabilityStatus::Queued);
        let blocked = OperationStatus::Blocked;
        assert_eq!(item_outcome(blocked, Some(&stuck)), Some(ItemOutcome::Blocked));
        assert_eq!(item_outcome(blocked, Some(&waiting)), None);
        // A block by a person or caller is theirs to clear: not settled.
        assert_eq!(item_outcome(blocked, None), None);
        for status in OperationStatus::ALL {
            if *status != blocked {
                assert_eq!(
                    item_outcome(*status, Some(&stuck)),
                    settled_outcome(*status),
                    "{status}"
                );
            }
        }
        // Only a block gives way to the outcome the work reaches later.
        for outcome in ItemOutcome::ALL {
            for later in ItemOutcome::ALL {
                let replaced = *outcome == ItemOutcome::Blocked && *later != ItemOutcome::Blocked;
                assert_eq!(outcome.is_replaced_by(*later), replaced, "{outcome} by {later}");
            }
        }
        let mut progress = BatchProgress {
            total: 2,
            ..BatchProgress::default()
        };
        progress.settle(ItemOutcome::Succeeded);
        progress.settle(ItemOutcome::Blocked);
        assert!(!is_active(&progress));
        assert_eq!(batch_status(&progress, false), BatchStatus::CompletedWithFailures);
        assert!(!ItemOutcome::Blocked.is_resumable());
    }

    #[test]
    fn progress_is_exact_through_settle_and_resume() {
        let mut progress = BatchProgress {
            total: 3,
            ..BatchProgress::default()
        };
        assert!(is_active(&progress));
        progress.settle(ItemOutcome::Succeeded);
        progress.settle(ItemOutcome::Failed);
        progress.settle(ItemOutcome::Cancelled);
        assert!(!is_active(&progress));
        assert_eq!(batch_status(&progress, false), BatchStatus::CompletedWithFailures);
        progress.unsettle(ItemOutcome::Failed);
        assert_eq!(progress.remaining(), 1);
        assert_eq!((progress.failed, progress.cancelled, progress.succeeded), (0, 1, 1));
        assert_eq!(batch_status(&progress, true), BatchStatus::Cancelling);
        assert!(ItemOutcome::Cancelled.is_resumable() && !ItemOutcome::Skipped.is_resumable());
    }
}
