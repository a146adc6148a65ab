//! The ledger as of one log position: every event up to `as_of_seq`,
//! folded by the engine's own fold (the routine replay runs) with the
//! domain's projectors in their order, so the rows are what the projection
//! tables held when the log's head was at that position. Only the
//! projection an export reads and those it depends on (`depends_on`,
//! transitively) are folded: a projection's rows never depend on the
//! projections that depend on it.
//!
//! *Why rows are written back as they are folded:* an export of a large
//! ledger holds every operation, and a whole row in memory (its strings
//! each an allocation, the cache's map entry) is about three times its
//! encoded cells. The fold keeps a bounded cache of whole rows, as replay
//! does, and writes what changed back to [`SpilledRows`] after every
//! chunk of events; the export then reads the rows from there, in key
//! order.

use super::spilled::SpilledRows;
use futures::StreamExt;
use opledger_domain::projections::{all_projectors, spec_by_name, Projector, WorkingSet};
use opledger_domain::EventEnvelope;
use opledger_engine::{fold_events, EngineError};
use opledger_store::Store;

/// Events read per page of the log.
const PAGE: usize = 2_000;

/// How an export folds: events per chunk (a chunk is folded, written back
/// and followed by a checkpoint) and whole rows kept cached between chunks.
#[derive(Debug, Clone, Copy)]
pub struct FoldLimits {
    pub chunk: usize,
    pub cache_rows: usize,
}

impl Default for FoldLimits {
    /// A chunk folds in a few milliseconds, well inside a checkpoint's
    /// 250 ms; the cache holds the rows of the operations in flight (those
    /// touched again soon) and stays a few MiB.
    fn default() -> Self {
        FoldLimits {
            chunk: 2_000,
            cache_rows: 10_000,
        }
    }
}

/// Why a fold stopped before the end.
#[derive(Debug)]
pub enum FoldStop {
    Failed(EngineError),
    /// The checkpoint said stop (a cancel reached the child).
    Stopped,
}

impl From<EngineError> for FoldStop {
    fn from(error: EngineError) -> Self {
        FoldStop::Failed(error)
    }
}

/// The projectors that fold `projection` and everything it depends on,
/// in fold order.
pub fn projectors_for(projection: &str) -> Vec<&'static dyn Projector> {
    let mut needed = vec![projection];
    let mut at = 0;
    while at < needed.len() {
        if let Some(spec) = spec_by_name(needed[at]) {
            for parent in spec.depends_on {
                if !needed.contains(parent) {
                    needed.push(parent);
                }
            }
        }
        at += 1;
    }
    all_projectors()
        .iter()
        .copied()
        .filter(|projector| needed.contains(&projector.spec().name))
        .collect()
}

/// Folds the log up to and including `as_of_seq` into `projection` (and
/// what it depends on), calling `checkpoint` with the last seq folded
/// after every chunk (it decides itself how often to look at the clock);
/// an error from it stops the fold.
pub async fn fold_until<S: Store>(
    store: &S,
    as_of_seq: i64,
    projection: &str,
    limits: FoldLimits,
    mut checkpoint: impl FnMut(i64) -> Result<(), ()>,
) -> Result<SpilledRows, FoldStop> {
    let projectors = projectors_for(projection);
    let mut spilled = SpilledRows::default();
    let mut cache = WorkingSet::forgetting_stored_rows();
    let chunk_size = limits.chunk.max(1);
    let mut chunk: Vec<EventEnvelope> = Vec::with_capacity(chunk_size);
    let mut events = store.read_all(0, PAGE);
    loop {
        let next = match events.next().await {
            Some(event) => Some(event.map_err(EngineError::Store)?),
            None => None,
        };
        let end = next.as_ref().is_none_or(|event| event.seq > as_of_seq);
        if let Some(event) = next.filter(|event| event.seq <= as_of_seq) {
            chunk.push(event);
        }
        if chunk.len() >= chunk_size || (end && !chunk.is_empty()) {
            fold_events(&mut spilled, &mut cache, &projectors, &chunk).await?;
            let last = chunk.last().map_or(0, |event| event.seq);
            chunk.clear();
            if cache.len() > limits.cache_rows {
                cache.clear();
            }
            checkpoint(last).map_err(|()| FoldStop::Stopped)?;
        }
        if end {
            return Ok(spilled);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(projection: &str) -> Vec<&'static str> {
        projectors_for(projection)
            .iter()
            .map(|projector| projector.spec().name)
            .collect()
    }

    #[test]
    fn an_export_folds_its_projection_and_what_it_depends_on_in_fold_order() {
        assert_eq!(names("media_operations"), ["media_operations"]);
        assert_eq!(names("batches"), ["batches"]);
        assert_eq!(
            names("entity_capability_states"),
            [
                "task_kinds",
                "media_registry",
                "processing_states",
                "entity_capability_states"
            ]
        );
    }
}
