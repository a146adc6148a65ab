//! `needs`: a kind's work on an item waits until the capabilities it needs
//! have succeeded on that item.
//!
//! An operation whose needs are unmet is `blocked`, and its block records
//! which capability it waits for and where that capability stood
//! ([`BlockedOn`]). The block is *waiting* while the needed work may still
//! succeed without a person (it is pending, queued, running, retrying,
//! stale, blocked itself, or not requested yet) and *stuck* once that work
//! ended without a result (failed for good, nothing found, not applicable,
//! skipped): only then is the block a person's business, and only for a
//! required kind (the review policy, `crate::review::route`). When the last
//! need succeeds the operation is queued in the same transaction, with
//! [`DEPENDENCY_SATISFIED`] as its reason.

use crate::status::CapabilityStatus;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The reason recorded when an operation leaves `blocked` because its last
/// need succeeded.
pub const DEPENDENCY_SATISFIED: &str = "dependency_satisfied";

/// The need an operation waits for: a capability of its item, and where
/// that capability stood when the block was recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockedOn {
    pub capability: String,
    /// The capability's status on the item; `None` while no work producing
    /// it has been requested on the item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<CapabilityStatus>,
}

impl BlockedOn {
    /// Whether the need can still be met without a person.
    pub fn is_waiting(&self) -> bool {
        self.status.is_none_or(|status| !ends_unmet(status))
    }

    /// The block's reason as the timeline shows it.
    pub fn reason(&self) -> String {
        format!("needs capability {self}")
    }
}

impl fmt::Display for BlockedOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.status {
            Some(status) => write!(f, "{} ({status})", self.capability),
            None => write!(f, "{} (not requested)", self.capability),
        }
    }
}

/// Capability statuses in which the work producing a capability ended
/// without it: a need on it stays unmet until a person acts.
fn ends_unmet(status: CapabilityStatus) -> bool {
    use CapabilityStatus as C;
    match status {
        C::FailedTerminal | C::NoResult | C::MissingConfirmed | C::NotApplicable | C::Skipped => true,
        C::Pending | C::Queued | C::Running | C::Succeeded | C::Blocked | C::FailedRetryable | C::Stale => false,
    }
}

/// The need that keeps an operation of a kind with `needs` from running,
/// given the status of each capability on its item (`None`: not
/// requested); `None` when every need has succeeded. A need whose work
/// ended without a result is named before one still waiting (the block is
/// then a person's business), and among equals the first in name order.
pub fn unmet_need(needs: &[String], status_of: impl Fn(&str) -> Option<CapabilityStatus>) -> Option<BlockedOn> {
    let unmet: Vec<BlockedOn> = needs
        .iter()
        .map(|capability| BlockedOn {
            capability: capability.clone(),
            status: status_of(capability),
        })
        .filter(|need| need.status != Some(CapabilityStatus::Succeeded))
        .collect();
    let stuck = unmet.iter().position(|need| !need.is_waiting());
    let chosen = stuck.or(if unmet.is_empty() { None } else { Some(0) })?;
    unmet.into_iter().nth(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use CapabilityStatus as C;

    fn needs(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn every_need_succeeded_leaves_nothing_unmet() {
        assert_eq!(
            unmet_need(&needs(&["metadata", "thumbnail"]), |_| Some(C::Succeeded)),
            None
        );
        assert_eq!(unmet_need(&[], |_| None), None);
    }

    #[test]
    fn a_need_that_ended_without_a_result_is_named_before_one_still_waiting() {
        let unmet = unmet_need(&needs(&["metadata", "thumbnail"]), |capability| match capability {
            "metadata" => Some(C::Queued),
            _ => Some(C::FailedTerminal),
        })
        .unwrap();
        assert_eq!(unmet.capability, "thumbnail");
        assert!(!unmet.is_waiting());
        assert_eq!(unmet.reason(), "needs capability thumbnail (failed_terminal)");
    }

    #[test]
    fn a_need_not_requested_or_still_in_progress_is_waiting() {
        let unmet = unmet_need(&needs(&["metadata"]), |_| None).unwrap();
        assert!(unmet.is_waiting());
        assert_eq!(unmet.reason(), "needs capability metadata (not requested)");
        for status in CapabilityStatus::ALL {
            let blocked = BlockedOn {
                capability: "metadata".into(),
                status: Some(*status),
            };
            let waiting = matches!(
                status,
                C::Pending | C::Queued | C::Running | C::Succeeded | C::Blocked | C::FailedRetryable | C::Stale
            );
            assert_eq!(blocked.is_waiting(), waiting, "{status}");
        }
    }
}
