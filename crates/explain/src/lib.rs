//! The words a person reads about the ledger: why an operation stands
//! where it stands, as a typed [`Why`] and one sentence; its timeline as
//! history lines ([`history`]); and the pieces both are made of
//! ([`words`]): durations, clock times in the reader's zone, short actors
//! and ids, and values quoted short for display.
//!
//! Pure functions of the projected rows (the operation, its processing
//! state, its capability), the kind's retry policy, the operation's place
//! in the claim queue, and the time: the engine gathers those facts, this
//! crate decides what they mean, and any reader (the CLI, an HTTP service)
//! renders the same sentence. The reader's time zone is an argument, so it
//! reads no clock and no environment.
//!
//! It must not know a database, an async runtime or HTTP: it depends on
//! `opledger-domain` (whose rows and events it puts into words) and on
//! plain data crates only, which `tests/it/architecture/dependencies.rs`
//! checks. *Why:* the presentation is not the domain (a sentence can be
//! reworded without touching a fold), and every reader must say the same
//! thing about the same facts, whatever it reads them through.

pub mod history;
pub mod words;

use chrono::TimeZone;
use opledger_domain::kinds::BlockedOn;
use opledger_domain::projections::{CapabilityRow, OperationRow, ProcessingStateRow, INGESTION_FILE};
use opledger_domain::status::{CapabilityStatus, IngestionStage, OperationStatus};
use opledger_domain::tasks::RetryPolicy;
use opledger_domain::time::Timestamp;
use serde::Serialize;
use std::fmt::Display;
use words::{clock_time, millis_between, quote, short_id, span, QUOTE_CHARS};

/// Where a claimable task stands in its kind's claim order: how many
/// claimable tasks of its kind a worker would take first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct QueuePosition {
    /// Claimable tasks of the kind ahead of it (higher priority, or the same
    /// priority and waiting longer).
    pub ahead: u64,
    /// Of those, the ones of higher priority.
    pub higher_priority: u64,
    /// The count stopped at its bound: there are at least `ahead`.
    pub at_least: bool,
}

/// A running task's last reported progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProgressNote {
    pub phase: String,
    pub processed: Option<i64>,
    pub total: Option<i64>,
}

/// What the engine gathered about one operation.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    pub operation: &'a OperationRow,
    /// The task's processing state (none for a file ingestion).
    pub state: Option<&'a ProcessingStateRow>,
    /// The claim's lease as heartbeats extended it.
    pub lease_ends: Option<Timestamp>,
    pub progress: Option<&'a ProgressNote>,
    /// The declared kind's retry policy (none for a file ingestion).
    pub policy: Option<&'a RetryPolicy>,
    /// The capability the task produces on its item, if any.
    pub capability: Option<&'a CapabilityRow>,
    /// For claimable work: its place in the claim queue.
    pub queue: Option<QueuePosition>,
    /// When the operation entered its current status.
    pub since: Timestamp,
}

/// Why an operation stands where it stands.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Why {
    /// A file ingestion's stage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<IngestionStage>,
    #[serde(flatten)]
    pub standing: Standing,
}

/// The reason, one variant per situation a person tells apart.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "standing", rename_all = "snake_case")]
pub enum Standing {
    /// Created, not queued yet.
    Pending {
        reason: Option<String>,
    },
    /// Waiting in the queue: from `available_at`, behind `queue`.
    Queued {
        kind: String,
        available_at: Option<Timestamp>,
        queue: Option<QueuePosition>,
    },
    /// An attempt failed; the next one may start at `available_at`.
    RetryWaiting {
        kind: String,
        available_at: Timestamp,
        failures: i64,
        max_attempts: Option<u32>,
        error: Option<String>,
        queue: Option<QueuePosition>,
    },
    /// Waits for a capability its kind needs on the item.
    BlockedOnNeed {
        need: BlockedOn,
    },
    /// Blocked by a person or a caller.
    Blocked {
        reason: Option<String>,
    },
    /// A worker holds it (`started`: the operation recorded its start, as
    /// file ingestions do).
    Claimed {
        worker: Option<String>,
        started: bool,
        lease_ends: Option<Timestamp>,
        progress: Option<ProgressNote>,
    },
    /// Asked to stop; the worker has not acknowledged yet.
    CancelRequested {
        worker: Option<String>,
        lease_ends: Option<Timestamp>,
    },
    Succeeded {
        at: Timestamp,
        revision: Option<String>,
        output: Option<String>,
    },
    /// Succeeded, but a later version of the kind makes the result stale.
    Stale {
        at: Timestamp,
        produced_version: Option<String>,
        current_version: Option<String>,
    },
    NoResult {
        at: Timestamp,
        reason: Option<String>,
    },
    MissingConfirmed {
        at: Timestamp,
        reason: Option<String>,
    },
    NotApplicable {
        reason: Option<String>,
    },
    /// Failed; its retry (or its end) is being decided.
    FailedRetryable {
        at: Timestamp,
        failures: i64,
        max_attempts: Option<u32>,
        error: Option<String>,
    },
    FailedTerminal {
        at: Timestamp,
        error: Option<String>,
    },
    DeadLettered {
        at: Timestamp,
        reason: Option<String>,
    },
    Cancelled {
        at: Timestamp,
        reason: Option<String>,
    },
    Interrupted {
        at: Timestamp,
        reason: Option<String>,
    },
    Skipped {
        at: Timestamp,
        reason: Option<String>,
    },
}

/// Why the operation stands where it stands, from the facts.
pub fn why(facts: &Facts<'_>) -> Why {
    let operation = facts.operation;
    let state = facts.state;
    let reason = operation.status_reason.clone().filter(|text| !text.trim().is_empty());
    let error = operation.last_error.clone().or_else(|| reason.clone());
    let failures = state.map_or(0, |state| state.failure_count);
    let max_attempts = facts.policy.map(|policy| policy.max_attempts);
    let at = facts.since;
    let worker = operation.worker.clone();
    use OperationStatus as O;
    let standing = match operation.status {
        O::Pending => Standing::Pending { reason },
        O::Queued => Standing::Queued {
            kind: operation.kind.clone(),
            available_at: state.map(|state| state.available_at).or(operation.available_at),
            queue: facts.queue,
        },
        O::RetryWaiting => Standing::RetryWaiting {
            kind: operation.kind.clone(),
            available_at: state
                .map(|state| state.available_at)
                .or(operation.available_at)
                .unwrap_or(at),
            failures,
            max_attempts,
            error,
            queue: facts.queue,
        },
        O::Blocked => match &operation.blocked_on {
            Some(need) => Standing::BlockedOnNeed { need: need.clone() },
            None => Standing::Blocked { reason },
        },
        O::Leased | O::Running if operation.cancel_requested => Standing::CancelRequested {
            worker,
            lease_ends: facts.lease_ends.or(operation.lease_expires_at),
        },
        O::Leased | O::Running => Standing::Claimed {
            worker,
            started: operation.status == O::Running,
            lease_ends: facts.lease_ends.or(operation.lease_expires_at),
            progress: facts.progress.cloned(),
        },
        O::Succeeded => match facts
            .capability
            .filter(|capability| capability.status == CapabilityStatus::Stale)
        {
            Some(capability) => Standing::Stale {
                at,
                produced_version: capability.produced_version.clone(),
                current_version: capability.current_version.clone(),
            },
            None => Standing::Succeeded {
                at,
                revision: state.and_then(|state| state.completed_revision.clone()),
                output: state.and_then(|state| state.output.clone()),
            },
        },
        O::NoResult => Standing::NoResult { at, reason },
        O::MissingConfirmed => Standing::MissingConfirmed { at, reason },
        O::NotApplicable => Standing::NotApplicable { reason },
        O::FailedRetryable => Standing::FailedRetryable {
            at,
            failures,
            max_attempts,
            error,
        },
        O::FailedTerminal => Standing::FailedTerminal { at, error },
        O::DeadLettered => Standing::DeadLettered {
            at,
            reason: reason.or(error),
        },
        O::Cancelled => Standing::Cancelled { at, reason },
        O::Interrupted => Standing::Interrupted { at, reason },
        O::Skipped => Standing::Skipped { at, reason },
    };
    Why {
        stage: operation.stage.filter(|_| operation.kind == INGESTION_FILE),
        standing,
    }
}

impl Why {
    /// The explanation as one sentence, with times in `zone` and spans
    /// measured from `now`.
    pub fn sentence<Tz: TimeZone>(&self, now: Timestamp, zone: &Tz) -> String
    where
        Tz::Offset: Display,
    {
        let body = self.standing.sentence(now, zone);
        match self.stage {
            Some(stage) => format!("file ingestion at stage {stage}: {body}"),
            None => body,
        }
    }
}

/// `: text` when there is a text, else nothing.
fn colon(text: &Option<String>) -> String {
    text.as_deref()
        .filter(|text| !text.trim().is_empty())
        .map(|text| format!(": {}", quote(text, QUOTE_CHARS)))
        .unwrap_or_default()
}

fn attempt(failures: i64, max_attempts: Option<u32>) -> String {
    match max_attempts {
        Some(max) => format!("attempt {failures} of {max}"),
        None => format!("attempt {failures}"),
    }
}

fn queue_words(kind: &str, queue: Option<QueuePosition>) -> String {
    match queue {
        None => String::new(),
        Some(QueuePosition { ahead: 0, .. }) => "next in line".to_string(),
        Some(queue) => {
            let tasks = if queue.ahead == 1 { "task" } else { "tasks" };
            if queue.at_least {
                return format!("queued behind at least {} claimable {kind} {tasks}", queue.ahead);
            }
            let longer = queue.ahead.saturating_sub(queue.higher_priority);
            let which = match (queue.higher_priority, longer) {
                (_, 0) => " of higher priority".to_string(),
                (0, _) => " waiting longer".to_string(),
                (higher, longer) => format!(" ({higher} of higher priority, {longer} waiting longer)"),
            };
            format!("queued behind {} claimable {kind} {tasks}{which}", queue.ahead)
        }
    }
}

fn lease_words(lease_ends: Option<Timestamp>, now: Timestamp) -> String {
    match lease_ends {
        None => String::new(),
        Some(ends) => {
            let left = millis_between(now, ends);
            if left >= 0 {
                format!("lease ends in {}", span(left))
            } else {
                format!("lease ended {} ago: recovery interrupts it", span(left))
            }
        }
    }
}

impl Standing {
    fn sentence<Tz: TimeZone>(&self, now: Timestamp, zone: &Tz) -> String
    where
        Tz::Offset: Display,
    {
        let time = |at: Timestamp| clock_time(at, now, zone);
        match self {
            Standing::Pending { reason } => format!("pending: created, not queued yet{}", colon(reason)),
            Standing::Queued {
                kind,
                available_at,
                queue,
            } => match available_at {
                Some(at) if *at > now => format!("queued, not before {}", time(*at)),
                _ if queue.is_some() => queue_words(kind, *queue),
                _ => "queued".to_string(),
            },
            Standing::RetryWaiting {
                kind,
                available_at,
                failures,
                max_attempts,
                error,
                queue,
            } => {
                let failed = format!("{} failed{}", attempt(*failures, *max_attempts), colon(error));
                if *available_at > now {
                    format!("waiting for a retry at {} ({failed})", time(*available_at))
                } else {
                    let place = match queue_words(kind, *queue) {
                        words if words.is_empty() => String::new(),
                        words => format!("; {words}"),
                    };
                    format!("retry due since {} ({failed}){place}", time(*available_at))
                }
            }
            Standing::BlockedOnNeed { need } => {
                let then = if need.is_waiting() {
                    "; it is queued once that succeeds"
                } else {
                    "; that work ended without a result: a retry of its review entry runs it again"
                };
                format!("blocked: {}{then}", need.reason())
            }
            Standing::Blocked { reason } => match reason {
                Some(reason) => format!("blocked: {}", quote(reason, QUOTE_CHARS)),
                None => "blocked".to_string(),
            },
            Standing::Claimed {
                worker,
                started,
                lease_ends,
                progress,
            } => {
                let worker = worker.as_deref().map_or_else(|| "unknown".to_string(), words::short_actor);
                // A claim is the worker's start: the protocol records no
                // separate one for tasks, so `leased` reads as running too.
                let _ = started;
                let mut text = format!("running on worker {worker}");
                let lease = lease_words(*lease_ends, now);
                if !lease.is_empty() {
                    text.push_str(", ");
                    text.push_str(&lease);
                }
                if let Some(progress) = progress {
                    let counts = match (progress.processed, progress.total) {
                        (Some(done), Some(total)) => format!(" {done}/{total}"),
                        (Some(done), None) => format!(" {done}"),
                        _ => String::new(),
                    };
                    text.push_str(&format!(" ({}{counts})", progress.phase));
                }
                text
            }
            Standing::CancelRequested { worker, lease_ends } => {
                let detail: Vec<String> = [
                    worker.as_deref().map(|worker| format!("worker {}", words::short_actor(worker))),
                    Some(lease_words(*lease_ends, now)).filter(|words| !words.is_empty()),
                ]
                .into_iter()
                .flatten()
                .collect();
                let detail = if detail.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", detail.join(", "))
                };
                format!("cancel requested, waiting for the worker to acknowledge{detail}")
            }
            Standing::Succeeded { at, revision, output } => {
                let mut text = format!("succeeded at {}", time(*at));
                if let Some(revision) = revision {
                    text.push_str(&format!(" at revision {}", short_id(revision)));
                }
                if let Some(output) = output.as_deref().filter(|output| *output != "null") {
                    text.push_str(&format!(", output {}", quote(output, 80)));
                }
                text
            }
            Standing::Stale {
                at,
                produced_version,
                current_version,
            } => format!(
                "stale: succeeded at {} with version {}, but the kind is at version {} now (opledger reprocess --stale runs it again)",
                time(*at),
                produced_version.as_deref().unwrap_or("?"),
                current_version.as_deref().unwrap_or("?")
            ),
            Standing::NoResult { at, reason } => {
                format!("finished without a result at {}{}", time(*at), colon(reason))
            }
            Standing::MissingConfirmed { at, reason } => {
                format!("missing: confirmed at {}{}", time(*at), colon(reason))
            }
            Standing::NotApplicable { reason } => format!("not applicable{}", colon(reason)),
            Standing::FailedRetryable {
                at,
                failures,
                max_attempts,
                error,
            } => format!(
                "failed at {} ({} failed{}); its retry is not scheduled yet",
                time(*at),
                attempt(*failures, *max_attempts),
                colon(error)
            ),
            Standing::FailedTerminal { at, error } => {
                format!("failed for good at {}{}", time(*at), colon(error))
            }
            Standing::DeadLettered { at, reason } => format!(
                "dead-lettered at {}{}; a retry from the review queue runs it again",
                time(*at),
                colon(reason)
            ),
            Standing::Cancelled { at, reason } => {
                // Cancel reasons often repeat the word ("cancelled: the worker stopped").
                let reason = reason.as_deref().map(|text| {
                    text.strip_prefix("cancelled:")
                        .map_or(text, str::trim_start)
                        .to_string()
                });
                format!("cancelled at {}{}", time(*at), colon(&reason))
            }
            Standing::Interrupted { at, reason } => format!(
                "interrupted at {}{}; recovery requeues or fails it next",
                time(*at),
                colon(reason)
            ),
            Standing::Skipped { at, reason } => format!("skipped at {}{}", time(*at), colon(reason)),
        }
    }
}

#[cfg(test)]
mod tests;
