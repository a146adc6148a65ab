//! The ledger as of one log position: every event up to `as_of_seq`,
//! folded in memory by the domain's projectors in their order — the same
//! fold replay runs, so the rows are what the projection tables held when
//! the log's head was at that position.

use futures::StreamExt;
use opledger_domain::projections::{all_projectors, WorkingSet};
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

/// Folds the log up to and including `as_of_seq`, calling `checkpoint`
/// after every event (it decides itself how often to look at the clock);
/// an error from it stops the fold.
pub async fn fold_until<S: Store>(
    store: &S,
    as_of_seq: i64,
    mut checkpoint: impl FnMut(i64) -> Result<(), ()>,
) -> Result<WorkingSet, FoldStop> {
    let mut rows = WorkingSet::forgetting_stored_rows();
    let mut keys = Vec::new();
    let mut events = store.read_all(0, PAGE);
    while let Some(event) = events.next().await {
        let event = event.map_err(EngineError::Store)?;
        if event.seq > as_of_seq {
            break;
        }
        for projector in all_projectors() {
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
