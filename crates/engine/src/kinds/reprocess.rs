//! Reprocessing what a new version made stale: one batch over the stale
//! items, each requested again at the current version with the inputs it
//! was last requested with (the target's values filled in afresh).

use crate::error::EngineError;
use crate::tx::CommandContext;
use crate::work::{TaskRequest, TaskTarget};
use crate::Engine;
use opledger_domain::projections::{
    version_key, CapabilityRow, Cell, Row, CAPABILITY_STATES_TABLE, MEDIA_STATES_TABLE,
};
use opledger_domain::{BatchId, OperationId};
use opledger_store::Store;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Processing states read per round trip.
const STATES_PER_READ: usize = 500;

/// What `reprocess --stale` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReprocessOutcome {
    /// The batch over the stale items; none when nothing was stale.
    pub batch_id: Option<BatchId>,
    /// Tasks requested at the current version.
    pub requested: usize,
}

impl<S: Store> Engine<S> {
    /// Requests every stale capability's task again at its kind's current
    /// version (only `kind`'s, when given), in one batch named
    /// `batch_name` (or `reprocess stale ...`). Nothing stale: no batch.
    pub async fn reprocess_stale(
        &self,
        context: &CommandContext,
        kind: Option<&str>,
        batch_name: Option<String>,
    ) -> Result<ReprocessOutcome, EngineError> {
        let kinds = match kind {
            Some(name) => vec![self.task_kind(name).await?],
            None => self
                .task_kinds()
                .await?
                .into_iter()
                .filter(|row| row.declared)
                .collect(),
        };
        let mut requests = Vec::new();
        let mut names = Vec::new();
        for row in &kinds {
            let Some(declaration) = &row.declaration else { continue };
            let stale: Vec<CapabilityRow> = self
                .store
                .find_rows(
                    &CAPABILITY_STATES_TABLE,
                    &[(
                        "version_key",
                        Cell::Text(version_key(&row.name, Some(&declaration.version))),
                    )],
                    usize::MAX,
                )
                .await?
                .into_iter()
                .filter_map(|row| match row {
                    Row::Capability(capability) if capability.is_stale() => Some(capability),
                    _ => None,
                })
                .collect();
            if stale.is_empty() {
                continue;
            }
            names.push(row.name.clone());
            // The inputs each was requested with, less what the target fills.
            let mut inputs: BTreeMap<OperationId, Value> = BTreeMap::new();
            for chunk in stale.chunks(STATES_PER_READ) {
                let keys: Vec<String> = chunk.iter().map(|row| row.operation_id.to_string()).collect();
                for state in self.store.load_rows(&MEDIA_STATES_TABLE, &keys).await? {
                    if let Row::ProcessingState(state) = state {
                        let mut given: serde_json::Map<String, Value> =
                            serde_json::from_str(&state.inputs).unwrap_or_default();
                        given.retain(|name, _| !declaration.inputs.get(name).is_some_and(|input| input.from_target));
                        inputs.insert(state.operation_id, Value::Object(given));
                    }
                }
            }
            for capability in stale {
                requests.push(TaskRequest {
                    target: TaskTarget::Media(capability.media_id),
                    kind: row.name.clone(),
                    inputs: inputs
                        .remove(&capability.operation_id)
                        .unwrap_or_else(|| Value::Object(serde_json::Map::new())),
                    priority: 0,
                });
            }
        }
        if requests.is_empty() {
            return Ok(ReprocessOutcome {
                batch_id: None,
                requested: 0,
            });
        }
        let name = batch_name.unwrap_or_else(|| format!("reprocess stale {}", names.join(", ")));
        let requested = requests.len();
        let view = self.create_task_batch(context, name, names, requests).await?;
        Ok(ReprocessOutcome {
            batch_id: Some(view.batch.batch_id),
            requested,
        })
    }
}
