//! Recovery's decision about one held claim that looks dead: leave it (a
//! worker finished, extended or took it meanwhile), give it back unused,
//! or interrupt it and then requeue, cancel or fail the task per its
//! kind's policy. The engine reads the candidates, loads each one's state
//! (and lease) in its write transaction, says why it suspects the claim
//! ([`Suspicion`]), and appends what [`decide_recovery`] returns.

use crate::error::DomainError;
use crate::events::Event;
use crate::lease::lease_end;
use crate::projections::ProcessingStateRow;
use crate::tasks::RetryPolicy;
use crate::time::Timestamp;
use crate::work::{decide_interrupt_because, decide_report, ClaimOutcome, Fence};

/// Why recovery suspects a held claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Suspicion {
    /// Its lease may have ended: `extended_to` is the lease row's end
    /// (heartbeats move it), when the row exists.
    LeaseEnded { extended_to: Option<Timestamp> },
    /// Its worker is gone for `cause` (`gone` is false when the worker
    /// named on the task is not one of the gone ones). `ran` says whether
    /// the worker was running this claim when it went, when its flight
    /// record says.
    WorkerGone {
        gone: bool,
        cause: String,
        ran: Option<bool>,
    },
}

/// What recovery did with one claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovered {
    /// Not ours to judge (another worker's), and not counted.
    Left,
    /// Finished, failed, extended or taken again since it was read.
    Skipped,
    /// Given back unused: queued at once, nothing counted against it.
    Released,
    /// Given back unused, and its requested cancel finished.
    ReleasedCancelled,
    /// Interrupted, then queued again.
    Requeued,
    /// Interrupted, and its requested cancel finished.
    Cancelled,
    /// Interrupted, and failed (quarantined, or a kind that does not
    /// re-run on its own).
    Failed,
}

/// The decision and the events that record it (none when left or skipped).
#[derive(Debug, Clone, PartialEq)]
pub struct Recovery {
    pub recovered: Recovered,
    pub events: Vec<Event>,
}

/// Decides about the claim `claim_token` on the task `state` (as loaded in
/// the write; `None` when it has none) at `now`.
pub fn decide_recovery(
    state: Option<&ProcessingStateRow>,
    claim_token: &str,
    suspicion: Suspicion,
    policy: &RetryPolicy,
    now: Timestamp,
) -> Result<Recovery, DomainError> {
    let nothing = |recovered| {
        Ok(Recovery {
            recovered,
            events: Vec::new(),
        })
    };
    let Some(state) = state.filter(|state| state.claim_token.as_deref() == Some(claim_token)) else {
        return nothing(Recovered::Skipped);
    };
    let (cause, unused) = match suspicion {
        Suspicion::LeaseEnded { extended_to } => {
            let ends = lease_end(state.lease_expires_at, extended_to).unwrap_or(now);
            if ends >= now {
                return nothing(Recovered::Skipped);
            }
            (format!("lease expired at {ends}"), false)
        }
        Suspicion::WorkerGone { gone: false, .. } => return nothing(Recovered::Left),
        Suspicion::WorkerGone { cause, ran, .. } => match ran {
            Some(true) => (format!("{cause}, while it ran this task"), false),
            Some(false) => (format!("{cause}, before it started this task"), true),
            None => (cause, false),
        },
    };
    if unused {
        let fence = Fence {
            claim_token: claim_token.to_string(),
            revision: state.claimed_revision.clone(),
        };
        let events = decide_report(state, &fence, ClaimOutcome::Release { reason: cause }, policy, now, 0)?;
        let recovered = match events.last() {
            Some(Event::OperationCancelled(_)) => Recovered::ReleasedCancelled,
            _ => Recovered::Released,
        };
        return Ok(Recovery { recovered, events });
    }
    let events = decide_interrupt_because(state, policy, &cause)?;
    let recovered = match events.last() {
        Some(Event::OperationRequeued(_)) => Recovered::Requeued,
        Some(Event::OperationCancelled(_)) => Recovered::Cancelled,
        _ => Recovered::Failed,
    };
    Ok(Recovery { recovered, events })
}

#[cfg(test)]
#[path = "recovery_tests.rs"]
mod tests;
