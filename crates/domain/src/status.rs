//! The status vocabularies, exactly: 16 operation statuses,
//! 12 capability statuses and the 10 stages of a file ingestion (an
//! operation of kind [`INGESTION_FILE`]).
//!
//! Each vocabulary is a closed enum with one spelling per value, used in
//! events, in projection columns and on the command line alike, so a status
//! means the same thing wherever it is read.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

macro_rules! vocabulary {
    ($(#[$doc:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($variant),+ }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = String;
            fn from_str(text: &str) -> Result<Self, String> {
                match text {
                    $($text => Ok($name::$variant),)+
                    other => Err(format!(
                        "{other:?} is not a {}; expected one of: {}",
                        stringify!($name),
                        [$($text),+].join(", ")
                    )),
                }
            }
        }
    };
}

vocabulary!(
    /// Where one operation stands. Moves between these go through
    /// [`crate::transitions`] only.
    OperationStatus {
        Pending => "pending",
        Queued => "queued",
        Leased => "leased",
        Running => "running",
        RetryWaiting => "retry_waiting",
        Succeeded => "succeeded",
        NoResult => "no_result",
        MissingConfirmed => "missing_confirmed",
        NotApplicable => "not_applicable",
        Blocked => "blocked",
        FailedRetryable => "failed_retryable",
        FailedTerminal => "failed_terminal",
        DeadLettered => "dead_lettered",
        Cancelled => "cancelled",
        Interrupted => "interrupted",
        Skipped => "skipped",
    }
);

vocabulary!(
    /// Whether a media item can serve a capability now, and if not, why.
    CapabilityStatus {
        NotApplicable => "not_applicable",
        Pending => "pending",
        Queued => "queued",
        Running => "running",
        Succeeded => "succeeded",
        NoResult => "no_result",
        MissingConfirmed => "missing_confirmed",
        Blocked => "blocked",
        FailedRetryable => "failed_retryable",
        FailedTerminal => "failed_terminal",
        Skipped => "skipped",
        Stale => "stale",
    }
);

vocabulary!(
    /// The stages of an `ingestion.file` operation, in the order a file
    /// moves through them. A file may skip stages that do not apply to it,
    /// but never goes back.
    IngestionStage {
        Discovered => "discovered",
        Settling => "settling",
        WaitingForLock => "waiting_for_lock",
        Queued => "queued",
        Hashing => "hashing",
        Parsing => "parsing",
        Scoring => "scoring",
        Registered => "registered",
        QueuedIdentity => "queued_identity",
        Completed => "completed",
    }
);

/// The task kind of file ingestions, the only kind that carries a stage.
pub const INGESTION_FILE: &str = "ingestion.file";

impl OperationStatus {
    /// Statuses an operation never leaves on its own: only an explicit
    /// recorded action (a retry from the review queue) reopens them.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            OperationStatus::Succeeded
                | OperationStatus::NoResult
                | OperationStatus::MissingConfirmed
                | OperationStatus::NotApplicable
                | OperationStatus::FailedTerminal
                | OperationStatus::DeadLettered
                | OperationStatus::Cancelled
                | OperationStatus::Skipped
        )
    }

    /// Statuses in which a worker holds a claim on the operation.
    pub fn is_claimed(self) -> bool {
        matches!(self, OperationStatus::Leased | OperationStatus::Running)
    }

    /// Terminal statuses that are failures: the work will not produce its
    /// result unless a person acts (a retry from the review queue, or the
    /// missing file put back). A batch counts these items as failed.
    pub fn is_failed_for_good(self) -> bool {
        matches!(
            self,
            OperationStatus::FailedTerminal | OperationStatus::DeadLettered | OperationStatus::MissingConfirmed
        )
    }
}

impl IngestionStage {
    /// Position in the stage order; later stages have larger ranks.
    pub fn rank(self) -> usize {
        IngestionStage::ALL
            .iter()
            .position(|stage| *stage == self)
            .expect("every stage is listed in ALL")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabularies_have_exactly_the_spec_sizes() {
        assert_eq!(OperationStatus::ALL.len(), 16);
        assert_eq!(CapabilityStatus::ALL.len(), 12);
        assert_eq!(IngestionStage::ALL.len(), 10);
    }

    #[test]
    fn every_spelling_round_trips_through_text_and_json() {
        for status in OperationStatus::ALL {
            assert_eq!(status.as_str().parse::<OperationStatus>().unwrap(), *status);
            let json = serde_json::to_string(status).unwrap();
            assert_eq!(json, format!("\"{}\"", status.as_str()));
        }
        for status in CapabilityStatus::ALL {
            assert_eq!(status.as_str().parse::<CapabilityStatus>().unwrap(), *status);
        }
        for stage in IngestionStage::ALL {
            assert_eq!(stage.as_str().parse::<IngestionStage>().unwrap(), *stage);
        }
    }

    #[test]
    fn unknown_spelling_names_the_choices() {
        let error = "done".parse::<OperationStatus>().unwrap_err();
        assert!(error.contains("succeeded"), "{error}");
    }
}
