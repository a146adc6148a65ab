//! The ledger as of one log position: every event up to `as_of_seq`,
//! folded in memory by the domain's projectors in their order — the same
//! fold replay runs, so the rows are what the projection tables held when
//! the log's head was at that position. Only the projection an export
//! reads and those it depends on (`depends_on`, transitively) are folded:
//! a projection's rows never depend on the projections that depend on it,
//! and the memory an export holds is then that of its own rows.

use futures::StreamExt;
use opledger_domain::projections::{all_projectors, spec_by_name, Projector, WorkingSet};
use opledger_engine::EngineError;
use opledger_store::Store;

/// Events read per page of the log.
const PAGE: usize = 2_000;

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
/// what it depends on), calling `checkpoint` after every event (it decides
/// itself how often to look at the clock); an error from it stops the fold.
pub async fn fold_until<S: Store>(
    store: &S,
    as_of_seq: i64,
    projection: &str,
    mut checkpoint: impl FnMut(i64) -> Result<(), ()>,
) -> Result<WorkingSet, FoldStop> {
    let projectors = projectors_for(projection);
    let mut rows = WorkingSet::forgetting_stored_rows();
    let mut keys = Vec::new();
    let mut events = store.read_all(0, PAGE);
    while let Some(event) = events.next().await {
        let event = event.map_err(EngineError::Store)?;
        if event.seq > as_of_seq {
            break;
        }
        for projector in &projectors {
            keys.clear();
            projector.keys(&event, &mut keys);
            for key in keys.drain(..) {
                if !rows.is_known(&key) {
                    rows.insert_loaded(key, None);
                }
            }
            projector.apply(&event, &mut rows).map_err(EngineError::from)?;
        }
        // The fold keeps every row; what changed is of no interest here.
        if event.seq % 4_096 == 0 {
            rows.take_dirty();
        }
        checkpoint(event.seq).map_err(|()| FoldStop::Stopped)?;
    }
    Ok(rows)
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
