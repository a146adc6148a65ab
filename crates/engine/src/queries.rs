//! Read queries behind `status` and `timeline`: they read projections and
//! the log through the store's read pool, never the writer.

use crate::error::EngineError;
use crate::Engine;
use opledger_domain::projections::{operation_key, OperationRow, Row, MEDIA_TABLE, OPERATIONS_TABLE, REGIONS_TABLE};
use opledger_domain::{EventEnvelope, OperationId, OperationStatus, StreamId};
use opledger_store::Store;
use serde::Serialize;

/// Where one projection stands relative to the head of the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProjectionLag {
    pub name: String,
    pub version: u32,
    pub position: i64,
    /// Events in the log the projection has not folded yet.
    pub lag: i64,
}

/// The dashboard summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusReport {
    pub backend: &'static str,
    /// The highest seq in the log.
    pub head: i64,
    pub media: i64,
    pub regions: i64,
    pub operations: i64,
    /// Every operation status with its count, zeros included.
    pub operations_by_status: Vec<(String, i64)>,
    pub projections: Vec<ProjectionLag>,
}

impl<S: Store> Engine<S> {
    pub async fn status(&self) -> Result<StatusReport, EngineError> {
        let head = self.store.head().await?;
        let counted = self.store.count_by(&OPERATIONS_TABLE, "status").await?;
        let operations_by_status = OperationStatus::ALL
            .iter()
            .map(|status| {
                let count = counted
                    .iter()
                    .find(|(name, _)| name.as_deref() == Some(status.as_str()))
                    .map_or(0, |(_, count)| *count);
                (status.as_str().to_string(), count)
            })
            .collect();
        let projections = self
            .store
            .projection_states()
            .await?
            .into_iter()
            .map(|state| ProjectionLag {
                lag: (head - state.position).max(0),
                name: state.name,
                version: state.version,
                position: state.position,
            })
            .collect();
        Ok(StatusReport {
            backend: self.store.backend(),
            head,
            media: self.store.count_rows(&MEDIA_TABLE).await?,
            regions: self.store.count_rows(&REGIONS_TABLE).await?,
            operations: counted.iter().map(|(_, count)| count).sum(),
            operations_by_status,
            projections,
        })
    }

    /// The operation's events in order, with actor, time and cause.
    pub async fn timeline(&self, operation_id: OperationId) -> Result<Vec<EventEnvelope>, EngineError> {
        let events = self.store.read_stream(&StreamId::operation(operation_id)).await?;
        if events.is_empty() {
            return Err(EngineError::not_found("operation", operation_id));
        }
        Ok(events)
    }

    /// The projected row of one operation.
    pub async fn operation(&self, operation_id: OperationId) -> Result<OperationRow, EngineError> {
        let key = operation_key(operation_id);
        match self
            .store
            .load_rows(&OPERATIONS_TABLE, &[key.key])
            .await?
            .into_iter()
            .next()
        {
            Some(Row::Operation(row)) => Ok(row),
            _ => Err(EngineError::not_found("operation", operation_id)),
        }
    }
}
