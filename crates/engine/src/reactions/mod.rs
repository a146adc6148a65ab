//! The reactions that follow every command's events inside its transaction
//! (listed, in order, by `tx::REACTIONS`): each reads what the command
//! appended (and what the reactions before it added) and the rows it
//! left, and says what else must be recorded in the same transaction.
//!
//! A reaction knows no command: it sees envelopes and rows only, so every
//! command gets it by committing, and none can forget it. Its events are
//! the system's (actor `system`), in the flow of the event they follow
//! (its correlation id), caused by it (`seq:N`), at its time.

mod applicability;
mod needs;
mod settlement;
mod versions;

pub(crate) use settlement::settlement_reason;

use crate::error::EngineError;
use opledger_domain::events::Event;
use opledger_domain::projections::WorkingSet;
use opledger_domain::{EventEnvelope, NewEvent};
use opledger_store::{StreamAppend, WriteTx};

/// One reaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reaction {
    /// Applicability: a task that goes back to the queue for a revision
    /// whose content is of a media kind its kind does not apply to is
    /// recorded `not_applicable` instead of waiting to fail on it.
    Applicability,
    /// Needs: when work on an item settles or is reopened, the item's tasks
    /// blocked by their kind's `needs` are queued once every need has
    /// succeeded (reason `dependency_satisfied`), or blocked again with
    /// the need they now wait for.
    Needs,
    /// Completion reconciliation: for every operation the events left
    /// settled (or blocked by a need that ended without a result), the
    /// batches holding it as an unsettled item record its outcome, on each
    /// batch's stream, right after the events that settled it.
    BatchSettlement,
    /// Versions: a task that waits at a version of its kind other than
    /// the declared one — every waiting task of a kind just declared at a
    /// new version, or one these events put back to waiting — is requested
    /// again at the declared version (reason `version_changed`).
    Versions,
}

impl Reaction {
    /// The appends this reaction makes for `envelopes` (none when nothing
    /// concerns it).
    pub(crate) async fn appends<T: WriteTx>(
        self,
        tx: &mut T,
        rows: &WorkingSet,
        envelopes: &[EventEnvelope],
    ) -> Result<Vec<StreamAppend>, EngineError> {
        match self {
            Reaction::Applicability => applicability::mark_not_applicable(tx, rows, envelopes).await,
            Reaction::BatchSettlement => settlement::batch_settlements(tx, rows, envelopes).await,
            Reaction::Needs => needs::release_dependents(tx, rows, envelopes).await,
            Reaction::Versions => versions::retarget(tx, rows, envelopes).await,
        }
    }
}

/// A reaction's event following `envelope`.
fn follows(envelope: &EventEnvelope, event: Event) -> NewEvent {
    NewEvent {
        event,
        recorded_at: envelope.recorded_at,
        actor: "system".to_string(),
        correlation_id: envelope.correlation_id.clone(),
        causation_id: Some(format!("seq:{}", envelope.seq)),
    }
}
