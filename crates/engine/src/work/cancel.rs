//! Cancelling work: a task at a caller's request (at once when no worker
//! holds it; otherwise the worker is asked to stop at its next heartbeat),
//! and every unfinished task of a target that is being removed.

use super::{load_state, state_append, TaskOutcome};
use crate::error::EngineError;
use crate::tx::{spawnable, CommandContext, Decided, Stamp};
use crate::Engine;
use opledger_domain::events::Event;
use opledger_domain::projections::{state_key, state_table, Cell, Row, WorkingSet, REGIONS_TABLE};
use opledger_domain::tasks::TargetType;
use opledger_domain::work;
use opledger_domain::{MediaId, OperationId, RegionId};
use opledger_store::{BoxFuture, Store, StreamAppend, WriteTx};

impl<S: Store> Engine<S> {
    /// Cancels a task: at once when no worker holds it; otherwise the
    /// request is recorded and the worker sees it at its next heartbeat.
    pub fn cancel_task<'a>(
        &'a self,
        context: &'a CommandContext,
        operation_id: OperationId,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<TaskOutcome, EngineError>> {
        spawnable(async move {
            let once = context.once(
                "task.cancel",
                serde_json::json!({"operation_id": operation_id, "reason": reason}),
            );
            let stamp = self.stamp(context);
            let reason = reason.to_string();
            self.stamped_once(once, stamp, move |tx, rows, stamp| {
                Box::pin(async move {
                    let state = load_state(tx, rows, operation_id)
                        .await?
                        .ok_or_else(|| EngineError::not_found("task", operation_id))?;
                    let events = work::decide_cancel(&state, &reason)?;
                    if events.is_empty() {
                        return Ok(Decided::answer(TaskOutcome::of(&state), Vec::new()));
                    }
                    let events = events.into_iter().map(|event| stamp.event(event)).collect();
                    Ok(Decided::then(vec![state_append(&state, events)], move |rows, _| {
                        TaskOutcome::in_rows(rows, operation_id)
                    }))
                })
            })
            .await
        })
    }
}

/// The appends that cancel every unfinished task of a target about to be
/// removed (a media item with its regions, or one region), and the removal
/// of their lease rows: a worker holding one finds its claim lost at its
/// next heartbeat and stops without reporting.
pub(crate) async fn cancel_tasks_of_removed_target<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    media_id: MediaId,
    region_id: Option<RegionId>,
    stamp: &Stamp,
    reason: &str,
) -> Result<Vec<StreamAppend>, EngineError> {
    let mut states = Vec::new();
    let region_ids: Vec<Cell> = match region_id {
        Some(region_id) => vec![Cell::Uuid(region_id.0)],
        None => {
            states.extend(
                tx.find_rows_in(state_table(TargetType::Media), "media_id", &[Cell::Uuid(media_id.0)])
                    .await?,
            );
            tx.find_rows_in(&REGIONS_TABLE, "media_id", &[Cell::Uuid(media_id.0)])
                .await?
                .into_iter()
                .filter_map(|row| match row {
                    Row::Region(region) => Some(Cell::Uuid(region.region_id.0)),
                    _ => None,
                })
                .collect()
        }
    };
    if !region_ids.is_empty() {
        states.extend(
            tx.find_rows_in(state_table(TargetType::Region), "region_id", &region_ids)
                .await?,
        );
    }
    let mut appends = Vec::new();
    for row in states {
        let Row::ProcessingState(state) = row else {
            continue;
        };
        rows.insert_loaded(
            state_key(state.target_type, state.operation_id),
            Some(Row::ProcessingState(state.clone())),
        );
        if state.status.is_terminal() {
            continue;
        }
        if let Some(token) = &state.claim_token {
            tx.delete_lease(token).await?;
        }
        let event = Event::OperationCancelled(opledger_domain::events::OperationReason {
            operation_id: state.operation_id,
            reason: reason.to_string(),
        });
        appends.push(state_append(&state, vec![stamp.event(event)]));
    }
    Ok(appends)
}
