//! The reads of the work protocol: a task's processing state with its
//! claim's liveness joined in, from a read connection.

use super::TaskTarget;
use crate::error::EngineError;
use crate::Engine;
use opledger_domain::lease::lease_end;
use opledger_domain::projections::{state_locations, state_table, Cell, ProcessingStateRow, Row};
use opledger_domain::{OperationId, Timestamp};
use opledger_store::{Lease, Store};

/// A processing state with its claim's liveness joined in.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskView {
    pub state: ProcessingStateRow,
    /// Present while a claim is held.
    pub lease: Option<Lease>,
}

impl TaskView {
    /// The lease as extended by heartbeats (the claim's own otherwise).
    pub fn lease_expires_at(&self) -> Option<Timestamp> {
        lease_end(
            self.state.lease_expires_at,
            self.lease.as_ref().map(|lease| lease.lease_expires_at),
        )
    }

    pub fn heartbeat_at(&self) -> Option<Timestamp> {
        self.lease.as_ref().map(|lease| lease.heartbeat_at)
    }
}

impl<S: Store> Engine<S> {
    /// The processing state of `kind` on `target`, with its claim's
    /// liveness, from a read connection.
    pub async fn task_state(&self, target: TaskTarget, kind: &str) -> Result<Option<TaskView>, EngineError> {
        let kind = self.task_kind(kind).await?;
        if kind.target != target.target_type() {
            return Err(EngineError::invalid(format!(
                "task kind {} runs on {} targets, not on a {}",
                kind.name,
                kind.target,
                target.target_type()
            )));
        }
        let target_column = match target {
            TaskTarget::Media(_) => "media_id",
            TaskTarget::Region(_) => "region_id",
        };
        let found = self
            .store
            .find_rows(
                state_table(kind.target),
                &[
                    (target_column, Cell::Uuid(target.id())),
                    ("task_kind", Cell::Text(kind.name.clone())),
                ],
                1,
            )
            .await?;
        let Some(Row::ProcessingState(state)) = found.into_iter().next() else {
            return Ok(None);
        };
        self.view(state).await.map(Some)
    }

    /// The processing state of a task operation, from a read connection.
    pub async fn task_by_operation(&self, operation_id: OperationId) -> Result<Option<TaskView>, EngineError> {
        match self.read_state(operation_id).await? {
            Some(state) => self.view(state).await.map(Some),
            None => Ok(None),
        }
    }

    /// The processing state of a task operation, whichever table holds it,
    /// from a read connection.
    pub(super) async fn read_state(
        &self,
        operation_id: OperationId,
    ) -> Result<Option<ProcessingStateRow>, EngineError> {
        for (table, key) in state_locations(operation_id) {
            let found = self.store.load_rows(table, &[key.key.to_string()]).await?;
            if let Some(Row::ProcessingState(state)) = found.into_iter().next() {
                return Ok(Some(state));
            }
        }
        Ok(None)
    }

    async fn view(&self, state: ProcessingStateRow) -> Result<TaskView, EngineError> {
        let lease = match &state.claim_token {
            Some(token) => self.store.lease(token).await?,
            None => None,
        };
        Ok(TaskView { state, lease })
    }
}
