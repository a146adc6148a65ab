//! Capabilities: what a media item can serve (metadata, a thumbnail, tags,
//! an embedding, ...), which task kind produces each, and how a task's
//! operation status reads as a capability status.
//!
//! A capability is per media item; each is produced by exactly one task
//! kind, so a capability state follows that kind's one task operation on
//! the item. Pure data and pure mapping: whether a produced version is stale
//! is decided by the engine and recorded (`operation_stale`), never derived
//! here from a registry that a later build may change.

use crate::error::DomainError;
use crate::status::{CapabilityStatus, OperationStatus};
use serde::Serialize;

/// A capability and the task kind that produces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CapabilitySpec {
    pub name: &'static str,
    pub task_kind: &'static str,
    /// A required capability that is confirmed missing needs a person
    /// (review queue); an optional one that finds nothing ends `no_result`
    /// and needs nobody.
    pub required: bool,
    pub purpose: &'static str,
}

/// Every capability this build knows, in display order.
pub const CAPABILITIES: &[CapabilitySpec] = &[
    CapabilitySpec {
        name: "metadata",
        task_kind: "metadata",
        required: true,
        purpose: "format, dimensions and size are known",
    },
    CapabilitySpec {
        name: "thumbnail",
        task_kind: "thumbnail",
        required: true,
        purpose: "a preview image exists",
    },
    CapabilitySpec {
        name: "perceptual_hash",
        task_kind: "perceptual_hash",
        required: false,
        purpose: "near-duplicates can be found",
    },
    CapabilitySpec {
        name: "tags",
        task_kind: "auto_tagging",
        required: false,
        purpose: "model-predicted tags exist",
    },
    CapabilitySpec {
        name: "embedding",
        task_kind: "full_embedding",
        required: false,
        purpose: "the item can be found by similarity",
    },
];

/// The capability a task kind produces, if it produces one on media items.
pub fn capability_for_task(task_kind: &str) -> Option<&'static CapabilitySpec> {
    CAPABILITIES.iter().find(|capability| capability.task_kind == task_kind)
}

/// The capability named `name`.
pub fn capability(name: &str) -> Result<&'static CapabilitySpec, DomainError> {
    CAPABILITIES
        .iter()
        .find(|capability| capability.name == name)
        .ok_or_else(|| {
            let known: Vec<&str> = CAPABILITIES.iter().map(|capability| capability.name).collect();
            DomainError::InvalidInput(format!("unknown capability {name:?}; known: {}", known.join(", ")))
        })
}

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
    use crate::tasks::{task_kind, TargetType};

    #[test]
    fn every_capability_is_produced_by_a_media_task_kind() {
        for capability in CAPABILITIES {
            let kind = task_kind(capability.task_kind).unwrap();
            assert_eq!(kind.target, TargetType::Media, "{}", capability.name);
            assert_eq!(capability_for_task(kind.name), Some(capability));
        }
        assert!(capability_for_task("crop_embedding").is_none());
        assert!(capability("lyrics").is_err());
    }

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
