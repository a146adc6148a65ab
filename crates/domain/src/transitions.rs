//! The operation transition table: the only way an operation changes status.
//!
//! Every move is named by a [`Cause`]; a cause has exactly one destination
//! status and a fixed set of statuses it may leave. A move the table lacks is
//! refused with a [`TransitionError`] naming from, to and cause, before any
//! event is built, so nothing is appended. The table is data, not scattered
//! `match` arms, so it can be printed (docs/state-machines.md), snapshotted and
//! tested pair by pair.

use crate::status::OperationStatus::{self, *};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// Why an operation changes status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Made claimable.
    Enqueue,
    /// A prerequisite is missing; waits for an unblock. Recorded again on a
    /// blocked operation when what it waits for changes.
    Block,
    /// The prerequisite arrived.
    Unblock,
    /// A worker claimed it and holds a lease.
    Claim,
    /// The claiming worker started executing.
    Start,
    /// The worker produced its output.
    Succeed,
    /// The worker ran and found nothing to produce (optional outputs).
    FindNothing,
    /// The input is confirmed absent (file deleted, source gone).
    ConfirmMissing,
    /// The task does not apply to this target.
    MarkNotApplicable,
    /// Deliberately not run.
    Skip,
    /// An application error that may succeed on retry.
    FailRetryable,
    /// An error that retrying cannot fix, or attempts exhausted.
    FailTerminal,
    /// A retry was scheduled at a recorded time.
    ScheduleRetry,
    /// Retries exhausted; parked for an operator.
    DeadLetter,
    /// The claim was lost: lease expired or process crashed.
    Interrupt,
    /// Put back to the queue after an interruption.
    Requeue,
    /// Stopped by request; for claimed work only after the worker acknowledged.
    Cancel,
    /// Reopened by a recorded action (a retry from the review queue).
    Reopen,
    /// A new revision was requested for a task that had settled or was
    /// waiting to retry: it runs again, now.
    Request,
    /// A worker finished a revision that is no longer the requested one:
    /// back to the queue for the requested revision, never to done.
    Supersede,
    /// The claiming worker gave the claim back unused (it could not take
    /// the work on, or never received the claim's answer): back to the
    /// queue at once, counted neither as an attempt nor as a failure.
    Release,
}

impl Cause {
    pub const ALL: &'static [Cause] = &[
        Cause::Enqueue,
        Cause::Block,
        Cause::Unblock,
        Cause::Claim,
        Cause::Start,
        Cause::Succeed,
        Cause::FindNothing,
        Cause::ConfirmMissing,
        Cause::MarkNotApplicable,
        Cause::Skip,
        Cause::FailRetryable,
        Cause::FailTerminal,
        Cause::ScheduleRetry,
        Cause::DeadLetter,
        Cause::Interrupt,
        Cause::Requeue,
        Cause::Cancel,
        Cause::Reopen,
        Cause::Request,
        Cause::Supersede,
        Cause::Release,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Enqueue => "enqueue",
            Cause::Block => "block",
            Cause::Unblock => "unblock",
            Cause::Claim => "claim",
            Cause::Start => "start",
            Cause::Succeed => "succeed",
            Cause::FindNothing => "find_nothing",
            Cause::ConfirmMissing => "confirm_missing",
            Cause::MarkNotApplicable => "mark_not_applicable",
            Cause::Skip => "skip",
            Cause::FailRetryable => "fail_retryable",
            Cause::FailTerminal => "fail_terminal",
            Cause::ScheduleRetry => "schedule_retry",
            Cause::DeadLetter => "dead_letter",
            Cause::Interrupt => "interrupt",
            Cause::Requeue => "requeue",
            Cause::Cancel => "cancel",
            Cause::Reopen => "reopen",
            Cause::Request => "request",
            Cause::Supersede => "supersede",
            Cause::Release => "release",
        }
    }

    /// The one status this cause leads to.
    pub fn destination(self) -> OperationStatus {
        rule(self).destination
    }

    /// The statuses this cause may leave, in vocabulary order.
    pub fn sources(self) -> &'static [OperationStatus] {
        rule(self).from
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Cause {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        Cause::ALL
            .iter()
            .copied()
            .find(|cause| cause.as_str() == text)
            .ok_or_else(|| {
                let names: Vec<&str> = Cause::ALL.iter().map(|cause| cause.as_str()).collect();
                format!("{text:?} is not a cause; expected one of: {}", names.join(", "))
            })
    }
}

/// One row of the table: a cause, the statuses it may leave, where it leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Rule {
    pub cause: Cause,
    pub from: &'static [OperationStatus],
    pub destination: OperationStatus,
}

/// The statuses a new operation may be created in.
pub const INITIAL_STATUSES: &[OperationStatus] = &[Pending, Queued, Blocked];

/// The transition table. Order follows [`Cause::ALL`].
pub const TABLE: &[Rule] = &[
    Rule {
        cause: Cause::Enqueue,
        from: &[Pending],
        destination: Queued,
    },
    Rule {
        cause: Cause::Block,
        from: &[Pending, Queued, RetryWaiting, Blocked],
        destination: Blocked,
    },
    Rule {
        cause: Cause::Unblock,
        from: &[Blocked],
        destination: Pending,
    },
    Rule {
        cause: Cause::Claim,
        from: &[Queued, RetryWaiting],
        destination: Leased,
    },
    Rule {
        cause: Cause::Start,
        from: &[Leased],
        destination: Running,
    },
    Rule {
        cause: Cause::Succeed,
        from: &[Leased, Running],
        destination: Succeeded,
    },
    Rule {
        cause: Cause::FindNothing,
        from: &[Leased, Running],
        destination: NoResult,
    },
    Rule {
        cause: Cause::ConfirmMissing,
        from: &[Pending, Queued, Leased, Running, RetryWaiting, Blocked],
        destination: MissingConfirmed,
    },
    Rule {
        cause: Cause::MarkNotApplicable,
        from: &[Pending, Queued, Leased, Running, Blocked],
        destination: NotApplicable,
    },
    Rule {
        cause: Cause::Skip,
        from: &[Pending, Queued, Blocked],
        destination: Skipped,
    },
    Rule {
        cause: Cause::FailRetryable,
        from: &[Leased, Running],
        destination: FailedRetryable,
    },
    Rule {
        cause: Cause::FailTerminal,
        from: &[Leased, Running, FailedRetryable, Interrupted],
        destination: FailedTerminal,
    },
    Rule {
        cause: Cause::ScheduleRetry,
        from: &[FailedRetryable, Interrupted],
        destination: RetryWaiting,
    },
    Rule {
        cause: Cause::DeadLetter,
        from: &[FailedRetryable],
        destination: DeadLettered,
    },
    Rule {
        cause: Cause::Interrupt,
        from: &[Leased, Running],
        destination: Interrupted,
    },
    Rule {
        cause: Cause::Requeue,
        from: &[Interrupted],
        destination: Queued,
    },
    Rule {
        cause: Cause::Cancel,
        from: &[
            Pending,
            Queued,
            Leased,
            Running,
            RetryWaiting,
            Blocked,
            FailedRetryable,
            Interrupted,
        ],
        destination: Cancelled,
    },
    Rule {
        cause: Cause::Reopen,
        from: &[
            FailedTerminal,
            DeadLettered,
            Cancelled,
            MissingConfirmed,
            NoResult,
            Skipped,
        ],
        destination: Queued,
    },
    Rule {
        cause: Cause::Request,
        from: &[
            RetryWaiting,
            Succeeded,
            NoResult,
            MissingConfirmed,
            NotApplicable,
            FailedTerminal,
            DeadLettered,
            Cancelled,
            Skipped,
        ],
        destination: Queued,
    },
    Rule {
        cause: Cause::Supersede,
        from: &[Leased, Running],
        destination: Queued,
    },
    Rule {
        cause: Cause::Release,
        from: &[Leased, Running],
        destination: Queued,
    },
];

fn rule(cause: Cause) -> &'static Rule {
    TABLE
        .iter()
        .find(|rule| rule.cause == cause)
        .expect("every cause has exactly one rule; checked by a test")
}

/// A move the transition table lacks.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("illegal transition: cannot move operation from {from} to {to} by {cause}")]
pub struct TransitionError {
    pub from: OperationStatus,
    pub to: OperationStatus,
    pub cause: Cause,
}

/// Where `cause` takes an operation that is in `from`, or the refusal.
pub fn transition(from: OperationStatus, cause: Cause) -> Result<OperationStatus, TransitionError> {
    let rule = rule(cause);
    if rule.from.contains(&from) {
        Ok(rule.destination)
    } else {
        Err(TransitionError {
            from,
            to: rule.destination,
            cause,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_has_exactly_one_rule_in_cause_order() {
        assert_eq!(TABLE.len(), Cause::ALL.len());
        for (rule, cause) in TABLE.iter().zip(Cause::ALL) {
            assert_eq!(rule.cause, *cause);
        }
    }

    #[test]
    fn every_from_cause_pair_is_decided_by_the_table() {
        // Every (from, cause) pair of the vocabulary, all 16 × 21 of them:
        // allowed pairs lead to the rule's destination, the rest are refused
        // with an error that names from, to and cause.
        let mut allowed = 0;
        for from in OperationStatus::ALL {
            for cause in Cause::ALL {
                let listed = cause.sources().contains(from);
                match transition(*from, *cause) {
                    Ok(to) => {
                        assert!(listed, "{from} --{cause}--> accepted but not listed");
                        assert_eq!(to, cause.destination());
                        allowed += 1;
                    }
                    Err(error) => {
                        assert!(!listed, "{from} --{cause}--> listed but refused");
                        assert_eq!(error.from, *from);
                        assert_eq!(error.to, cause.destination());
                        assert_eq!(error.cause, *cause);
                        let message = error.to_string();
                        assert!(message.contains(from.as_str()), "{message}");
                        assert!(message.contains(cause.destination().as_str()), "{message}");
                        assert!(message.contains(cause.as_str()), "{message}");
                    }
                }
            }
        }
        assert_eq!(allowed, TABLE.iter().map(|rule| rule.from.len()).sum::<usize>());
    }

    #[test]
    fn terminal_statuses_are_left_only_by_a_recorded_reopen_or_request() {
        // A settled operation runs again only when someone asks: a retry from
        // the review queue (reopen) or a new revision (request).
        for from in OperationStatus::ALL.iter().filter(|status| status.is_terminal()) {
            for cause in Cause::ALL {
                if transition(*from, *cause).is_ok() {
                    assert!(
                        matches!(cause, Cause::Reopen | Cause::Request),
                        "{from} left by {cause}"
                    );
                }
            }
        }
    }

    #[test]
    fn claimed_statuses_are_left_only_with_a_recorded_reason() {
        // A claimed operation leaves leased/running only through causes that
        // carry a reason or an outcome in their event (never silently).
        let allowed = [
            Cause::Start,
            Cause::Succeed,
            Cause::FindNothing,
            Cause::ConfirmMissing,
            Cause::MarkNotApplicable,
            Cause::FailRetryable,
            Cause::FailTerminal,
            Cause::Interrupt,
            Cause::Cancel,
            Cause::Supersede,
            Cause::Release,
        ];
        for from in [Leased, Running] {
            for cause in Cause::ALL {
                if transition(from, *cause).is_ok() {
                    assert!(allowed.contains(cause), "{from} left by {cause}");
                }
            }
        }
    }

    #[test]
    fn every_status_is_reachable_from_an_initial_status() {
        let mut reached: Vec<OperationStatus> = INITIAL_STATUSES.to_vec();
        let mut changed = true;
        while changed {
            changed = false;
            for rule in TABLE {
                if rule.from.iter().any(|from| reached.contains(from)) && !reached.contains(&rule.destination) {
                    reached.push(rule.destination);
                    changed = true;
                }
            }
        }
        for status in OperationStatus::ALL {
            assert!(reached.contains(status), "{status} unreachable");
        }
    }

    #[test]
    fn transition_table_snapshot() {
        let rows: Vec<String> = TABLE
            .iter()
            .map(|rule| {
                let from: Vec<&str> = rule.from.iter().map(|status| status.as_str()).collect();
                format!(
                    "{:<20} {:<18} <- {}",
                    rule.cause.as_str(),
                    rule.destination.as_str(),
                    from.join(", ")
                )
            })
            .collect();
        insta::assert_snapshot!(rows.join("\n"));
    }
}
