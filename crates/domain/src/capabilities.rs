//! Capabilities: what a media item can serve (metadata, a thumbnail, tags,
//! an embedding, ...), and how a task's operation status reads as a
//! capability status.
//!
//! A capability is per media item; each is produced by exactly one declared
//! task kind (`crate::kinds`), so a capability state follows that kind's one
//! task operation on the item. Pure mapping: whether a produced version is
//! stale is decided by the engine and recorded (`task_version_changed`),
//! never derived here from a catalogue that may change later.

use crate::status::{CapabilityStatus, OperationStatus};

/// How the status of the task producing a capability reads as the
/// capability's status. `stale` says the result on hand was produced by a
/// task version that is no longer current; it matters only for results.
pub fn capability_status(status: OperationStatus, stale: bool) -> CapabilityStatus {
    use CapabilityStatus as C;
    use OperationStatus as O;
    match status {
        O::Succeeded | O::NoResult if stale => C::Stale,
        O::Pending => C::Pending,
        // Interrupted work goes back to the queue (or fails) in the same
        // transaction; while it is interrupted it is waiting to run again.
        O::Queued | O::Interrupted => C::Queued,
        O::Leased | O::Running => C::Running,
        O::Succeeded => C::Succeeded,
        O::NoResult => C::NoResult,
        O::MissingConfirmed => C::MissingConfirmed,
        O::NotApplicable => C::NotApplicable,
        O::Blocked => C::Blocked,
        // Waiting for a retry is a retryable failure as far as the item's
        // user is concerned: it cannot serve the capability yet, and will try.
        O::RetryWaiting | O::FailedRetryable => C::FailedRetryable,
        O::FailedTerminal | O::DeadLettered => C::FailedTerminal,
        O::Cancelled | O::Skipped => C::Skipped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_status_maps_to_a_capability_status() {
        let table: Vec<String> = OperationStatus::ALL
            .iter()
            .map(|status| {
                format!(
                    "{} -> {} (stale: {})",
                    status,
                    capability_status(*status, false),
                    capability_status(*status, true)
                )
            })
            .collect();
        assert_eq!(
            table,
            [
                "pending -> pending (stale: pending)",
                "queued -> queued (stale: queued)",
                "leased -> running (stale: running)",
                "running -> running (stale: running)",
                "retry_waiting -> failed_retryable (stale: failed_retryable)",
                "succeeded -> succeeded (stale: stale)",
                "no_result -> no_result (stale: stale)",
                "missing_confirmed -> missing_confirmed (stale: missing_confirmed)",
                "not_applicable -> not_applicable (stale: not_applicable)",
                "blocked -> blocked (stale: blocked)",
                "failed_retryable -> failed_retryable (stale: failed_retryable)",
                "failed_terminal -> failed_terminal (stale: failed_terminal)",
                "dead_lettered -> failed_terminal (stale: failed_terminal)",
                "cancelled -> skipped (stale: skipped)",
                "interrupted -> queued (stale: queued)",
                "skipped -> skipped (stale: skipped)",
            ]
        );
    }
}
