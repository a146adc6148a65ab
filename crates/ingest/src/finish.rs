//! The end of each file: once all its image tasks have settled, its
//! ingestion finishes, with the tasks' outcomes as its output.

use crate::run::{chunks, InFlight, CHUNK};
use crate::IngestError;
use opledger_domain::projections::ProcessingStateRow;
use opledger_domain::{MediaId, OperationId, OperationStatus};
use opledger_engine::{CommandContext, Engine};
use opledger_store::Store;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Files whose task states one poll reads at a time (see [`finish_settled`]).
pub(crate) const SETTLE_WINDOW: usize = 64;

/// What one poll finished.
pub(crate) struct Finished {
    /// Files whose ingestion finished.
    pub done: usize,
    /// Of those, files with a task that failed for good.
    pub failed: usize,
}

/// Finishes every file whose tasks have all settled, and keeps the others
/// in `in_flight`, in their order.
pub(crate) async fn finish_settled<S: Store>(
    engine: &Engine<S>,
    context: &CommandContext,
    in_flight: &mut Vec<InFlight>,
    give_up_after: std::time::Duration,
) -> Result<Finished, IngestError> {
    if in_flight.is_empty() {
        return Ok(Finished { done: 0, failed: 0 });
    }
    // Tasks are claimed about in registration order, so files settle about
    // in that order too: read the states of the oldest files a window at a
    // time, and stop at the first window where most are still running,
    // instead of reading every file's states on every poll.
    let mut states: BTreeMap<OperationId, ProcessingStateRow> = BTreeMap::new();
    let mut looked_at = 0;
    while looked_at < in_flight.len() {
        let window = &in_flight[looked_at..(looked_at + SETTLE_WINDOW).min(in_flight.len())];
        looked_at += window.len();
        let tasks: Vec<OperationId> = window.iter().flat_map(|file| file.tasks.iter().copied()).collect();
        let read = engine.media_task_states(&tasks).await?;
        let settled = read.iter().filter(|state| settled_here(state.status)).count();
        states.extend(read.into_iter().map(|state| (state.operation_id, state)));
        if settled * 2 < tasks.len() {
            break;
        }
    }
    let mut finished = Vec::new();
    let mut failed = 0;
    let mut not_looked_at = in_flight.split_off(looked_at);
    let mut still_running = Vec::new();
    for file in std::mem::take(in_flight) {
        let file_states: Vec<&ProcessingStateRow> = file.tasks.iter().filter_map(|id| states.get(id)).collect();
        let all_settled =
            file_states.len() == file.tasks.len() && file_states.iter().all(|state| settled_here(state.status));
        if !all_settled {
            still_running.push(file);
            continue;
        }
        let output = FileOutput::of(&file_states);
        if !output.failures.is_empty() {
            failed += 1;
        }
        let output = output.into_json(file.media_id);
        finished.push((file.claim, Ok(output)));
    }
    // Those still running go back in front of the ones not looked at.
    still_running.append(&mut not_looked_at);
    *in_flight = still_running;
    let done = finished.len();
    for chunk in chunks(finished, CHUNK) {
        crate::patience::patiently(give_up_after, "finish files", || {
            engine.finish_ingestions(context, chunk.clone())
        })
        .await?;
    }
    Ok(Finished { done, failed })
}

/// Whether a task is done with as far as this run goes: it ended, or it
/// is blocked. The ingest's kinds have no needs, so a block of theirs is
/// one the run asked for (what the task runs with is missing here: ffmpeg
/// not installed, a build without HEIF support), and nothing in this run
/// will lift it; the file finishes with the task `blocked`, not failed.
fn settled_here(status: OperationStatus) -> bool {
    status.is_terminal() || status == OperationStatus::Blocked
}

/// What a file's settled tasks came to.
struct FileOutput {
    /// Each task kind's final status.
    tasks: serde_json::Map<String, Value>,
    /// `kind: reason` of each task that failed for good.
    failures: Vec<String>,
}

impl FileOutput {
    fn of(states: &[&ProcessingStateRow]) -> FileOutput {
        let failures = states
            .iter()
            .filter(|state| state.status.is_failed_for_good())
            .map(|state| {
                format!(
                    "{}: {}",
                    state.task_kind,
                    state
                        .last_error
                        .as_deref()
                        .or(state.status_reason.as_deref())
                        .unwrap_or("failed")
                )
            })
            .collect();
        let tasks = states
            .iter()
            .map(|state| (state.task_kind.clone(), json!(state.status.as_str())))
            .collect();
        FileOutput { tasks, failures }
    }

    /// The ingestion's output.
    fn into_json(self, media_id: Option<MediaId>) -> Value {
        json!({
            "media_id": media_id,
            "tasks": self.tasks,
            "failures": self.failures,
        })
    }
}
