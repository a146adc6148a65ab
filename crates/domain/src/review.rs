//! The review queue's policy: which settled operations need a person, with
//! which reason code, and which actions resolve an entry.
//!
//! Only terminal or actionable states are routed; pending, queued, running,
//! retrying and stale work never appears. An optional capability that
//! finds nothing (`no_result`) needs nobody, and neither does work blocked
//! by its kind's `needs` while the work it waits for is still in progress.
//! Routing is a pure function of the operation's kind, status and block,
//! tested as a table.

use crate::kinds::BlockedOn;
use crate::status::{OperationStatus, INGESTION_FILE};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Why an entry is in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasonCode {
    /// The work failed for good (errors exhausted, a terminal error, or
    /// quarantined after too many interruptions).
    FailedTerminal,
    /// Parked by its kind's policy; an operator may retry it.
    DeadLettered,
    /// Waiting on something only a person can clear.
    Blocked,
    /// A required capability is confirmed missing.
    MissingRequired,
    /// An ingested file is gone from disk.
    SourceMissing,
}

impl ReasonCode {
    pub const ALL: &'static [ReasonCode] = &[
        ReasonCode::FailedTerminal,
        ReasonCode::DeadLettered,
        ReasonCode::Blocked,
        ReasonCode::MissingRequired,
        ReasonCode::SourceMissing,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReasonCode::FailedTerminal => "failed_terminal",
            ReasonCode::DeadLettered => "dead_lettered",
            ReasonCode::Blocked => "blocked",
            ReasonCode::MissingRequired => "missing_required",
            ReasonCode::SourceMissing => "source_missing",
        }
    }
}

impl fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ReasonCode {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        ReasonCode::ALL
            .iter()
            .copied()
            .find(|code| code.as_str() == text)
            .ok_or_else(|| {
                let known: Vec<&str> = ReasonCode::ALL.iter().map(|code| code.as_str()).collect();
                format!(
                    "{:?} is not a review reason code ({})",
                    text.chars().take(64).collect::<String>(),
                    known.join(", ")
                )
            })
    }
}

/// The routing policy: whether an operation of `kind` that reached `status`
/// gets a review entry, and why. `required`: whether the capability the
/// operation produces is required (false when it produces none).
/// `blocked_on`: for a blocked operation, the need of its kind it waits for
/// (`None` for a block by a person or caller, which always needs one).
pub fn route(
    kind: &str,
    status: OperationStatus,
    required: bool,
    blocked_on: Option<&BlockedOn>,
) -> Option<ReasonCode> {
    use OperationStatus as O;
    match status {
        O::FailedTerminal => Some(ReasonCode::FailedTerminal),
        O::DeadLettered => Some(ReasonCode::DeadLettered),
        // Waiting for work in progress needs nobody; a need whose work
        // ended without a result needs a person when the kind is required.
        O::Blocked => match blocked_on {
            Some(need) if need.is_waiting() => None,
            Some(_) => required.then_some(ReasonCode::Blocked),
            None => Some(ReasonCode::Blocked),
        },
        O::MissingConfirmed if kind == INGESTION_FILE => Some(ReasonCode::SourceMissing),
        O::MissingConfirmed => required.then_some(ReasonCode::MissingRequired),
        O::Pending
        | O::Queued
        | O::Leased
        | O::Running
        | O::RetryWaiting
        | O::Succeeded
        | O::NoResult
        | O::NotApplicable
        | O::FailedRetryable
        | O::Cancelled
        | O::Interrupted
        | O::Skipped => None,
    }
}

/// What a person decided about an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReviewAction {
    /// Run the work again (at its requested revision, or a given one); the
    /// entry closes when the work succeeds.
    Retry,
    /// Not worth doing: the entry closes and the work stays as it is.
    Dismiss,
    /// Seen and accepted as it is.
    Acknowledge,
}

impl ReviewAction {
    pub fn as_str(self) -> &'static str {
        match self {
            ReviewAction::Retry => "retry",
            ReviewAction::Dismiss => "dismiss",
            ReviewAction::Acknowledge => "acknowledge",
        }
    }
}

impl fmt::Display for ReviewAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ReviewAction {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "retry" => Ok(ReviewAction::Retry),
            "dismiss" => Ok(ReviewAction::Dismiss),
            "acknowledge" => Ok(ReviewAction::Acknowledge),
            other => Err(format!(
                "{other:?} is not a review action (retry, dismiss, acknowledge)"
            )),
        }
    }
}

/// Where an entry stands. Only `open` entries are in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryState {
    Open,
    /// A retry was asked for; the work is back in the protocol.
    Retrying,
    /// Closed: by dismiss or acknowledge, or by the retried work succeeding.
    Resolved,
    /// Closed because the work was requested again (a new revision) by
    /// something other than the queue.
    Superseded,
}

impl EntryState {
    pub const ALL: &'static [EntryState] = &[
        EntryState::Open,
        EntryState::Retrying,
        EntryState::Resolved,
        EntryState::Superseded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EntryState::Open => "open",
            EntryState::Retrying => "retrying",
            EntryState::Resolved => "resolved",
            EntryState::Superseded => "superseded",
        }
    }
}

impl fmt::Display for EntryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EntryState {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        EntryState::ALL
            .iter()
            .copied()
            .find(|state| state.as_str() == text)
            .ok_or_else(|| format!("{text:?} is not a review entry state"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy as a table: every status against a required capability's
    /// kind, an optional one's, a kind with no capability, and ingestion.
    #[test]
    fn routing_table() {
        let kinds = [
            ("metadata", true),
            ("perceptual_hash", false),
            ("crop_embedding", false),
            (INGESTION_FILE, false),
        ];
        let mut lines = Vec::new();
        for status in OperationStatus::ALL {
            let row: Vec<String> = kinds
                .iter()
                .map(|(kind, required)| {
                    route(kind, *status, *required, None).map_or("-".to_string(), |code| code.to_string())
                })
                .collect();
            lines.push(format!("{status}: {}", row.join(" | ")));
        }
        assert_eq!(
            lines,
            [
                "pending: - | - | - | -",
                "queued: - | - | - | -",
                "leased: - | - | - | -",
                "running: - | - | - | -",
                "retry_waiting: - | - | - | -",
                "succeeded: - | - | - | -",
                "no_result: - | - | - | -",
                "missing_confirmed: missing_required | - | - | source_missing",
                "not_applicable: - | - | - | -",
                "blocked: blocked | blocked | blocked | blocked",
                "failed_retryable: - | - | - | -",
                "failed_terminal: failed_terminal | failed_terminal | failed_terminal | failed_terminal",
                "dead_lettered: dead_lettered | dead_lettered | dead_lettered | dead_lettered",
                "cancelled: - | - | - | -",
                "interrupted: - | - | - | -",
                "skipped: - | - | - | -",
            ]
        );
    }

    /// A block by a need: nobody's business while the needed work is in
    /// progress; a required kind's once that work ended without a result.
    #[test]
    fn a_block_by_a_need_is_routed_only_when_stuck_and_required() {
        use crate::status::CapabilityStatus;
        let need = |status| BlockedOn {
            capability: "metadata".into(),
            status,
        };
        let blocked = OperationStatus::Blocked;
        for waiting in [
            None,
            Some(CapabilityStatus::Queued),
            Some(CapabilityStatus::FailedRetryable),
        ] {
            assert_eq!(
                route("caption", blocked, true, Some(&need(waiting))),
                None,
                "{waiting:?}"
            );
        }
        let stuck = need(Some(CapabilityStatus::FailedTerminal));
        assert_eq!(route("caption", blocked, true, Some(&stuck)), Some(ReasonCode::Blocked));
        assert_eq!(route("caption", blocked, false, Some(&stuck)), None);
        assert_eq!(route("caption", blocked, false, None), Some(ReasonCode::Blocked));
    }

    #[test]
    fn reason_codes_round_trip_and_unknown_ones_are_refused_naming_the_known() {
        for code in ReasonCode::ALL {
            assert_eq!(code.as_str().parse::<ReasonCode>().unwrap(), *code);
        }
        let refused = "broken".parse::<ReasonCode>().unwrap_err();
        assert!(refused.contains("source_missing"), "{refused}");
    }

    #[test]
    fn actions_parse_and_refuse_unknown_ones() {
        assert_eq!("retry".parse::<ReviewAction>().unwrap(), ReviewAction::Retry);
        assert!("delete".parse::<ReviewAction>().unwrap_err().contains("acknowledge"));
    }
}
