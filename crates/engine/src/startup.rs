//! Startup: bring every projection to the head of the log before anything
//! else runs. A projection stored at another version is rebuilt through a
//! shadow copy (build from the log in chunks while the old copy keeps
//! serving, catch up, swap in one transaction); one that is merely behind
//! (new in this build) is caught up in place.

use crate::error::EngineError;
use crate::fold::fold_events;
use crate::Engine;
use opledger_domain::projections::{all_projectors, Projector, WorkingSet};
use opledger_store::{Store, StoreError, TableSet, WriteTx};

/// What startup did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartupReport {
    /// (projection, stored version, new version, events folded).
    pub rebuilt: Vec<(String, u32, u32, u64)>,
    /// (projection, events folded).
    pub caught_up: Vec<(String, u64)>,
}

impl<S: Store> Engine<S> {
    /// Brings every projection to the head of the log. Run it before
    /// commands: inline folding refuses to run on a projection that is not
    /// at the head.
    pub async fn startup(&self) -> Result<StartupReport, EngineError> {
        let mut report = StartupReport::default();
        let states = self.store.projection_states().await?;
        for projector in all_projectors() {
            let spec = projector.spec();
            let state = states
                .iter()
                .find(|state| state.name == spec.name)
                .ok_or_else(|| StoreError::corrupt(format!("projection {} has no stored position", spec.name)))?;
            if state.version != spec.version {
                let folded = self.rebuild_through_shadow(*projector).await?;
                report
                    .rebuilt
                    .push((spec.name.to_string(), state.version, spec.version, folded));
            } else {
                let folded = self.catch_up(*projector).await?;
                if folded > 0 {
                    report.caught_up.push((spec.name.to_string(), folded));
                }
            }
        }
        Ok(report)
    }

    /// Folds the events a live projection has not seen, a chunk per
    /// transaction, until it is at the head.
    async fn catch_up(&self, projector: &'static dyn Projector) -> Result<u64, EngineError> {
        let chunk = self.fold_chunk;
        let mut folded = 0u64;
        loop {
            let (count, at_head) = self
                .store
                .write(move |tx: &mut S::Tx| {
                    Box::pin(async move {
                        let spec = projector.spec();
                        let position = tx.projection_position(spec).await?.ok_or_else(|| {
                            StoreError::conflict(format!("projection {} changed version during startup", spec.name))
                        })?;
                        let events = tx.read_events(position, chunk).await?;
                        let Some(last) = events.last().map(|event| event.seq) else {
                            return Ok::<_, EngineError>((0u64, true));
                        };
                        let mut rows = WorkingSet::default();
                        fold_events(tx, &mut rows, &[projector], &events).await?;
                        tx.advance_position(spec, position, last).await?;
                        Ok((events.len() as u64, events.len() < chunk))
                    })
                })
                .await?;
            folded += count;
            if at_head {
                return Ok(folded);
            }
        }
    }

    /// Rebuilds one projection from the log into a shadow copy and swaps it
    /// in. Each chunk is its own transaction, so writers keep going between
    /// chunks; the last chunk reads to the head and swaps inside the same
    /// transaction, so no event appended meanwhile can be missed.
    async fn rebuild_through_shadow(&self, projector: &'static dyn Projector) -> Result<u64, EngineError> {
        let spec = projector.spec();
        tracing::info!(
            projection = spec.name,
            version = spec.version,
            "rebuilding projection through a shadow"
        );
        self.store
            .write(move |tx: &mut S::Tx| {
                Box::pin(async move {
                    tx.create_shadow(spec).await?;
                    Ok::<_, EngineError>(())
                })
            })
            .await?;
        let chunk = self.fold_chunk;
        let mut folded = 0u64;
        loop {
            let (count, swapped) =
                self.store
                    .write(move |tx: &mut S::Tx| {
                        Box::pin(async move {
                            let position = tx.shadow_position(spec).await?.ok_or_else(|| {
                                StoreError::conflict(format!("the shadow of {} disappeared", spec.name))
                            })?;
                            let events = tx.read_events(position, chunk).await?;
                            tx.use_tables(TableSet::Shadow);
                            let mut rows = WorkingSet::default();
                            fold_events(tx, &mut rows, &[projector], &events).await?;
                            tx.use_tables(TableSet::Live);
                            if let Some(last) = events.last() {
                                tx.set_shadow_position(spec, last.seq).await?;
                            }
                            let at_head = events.len() < chunk;
                            if at_head {
                                tx.swap_shadow(spec).await?;
                            }
                            Ok::<_, EngineError>((events.len() as u64, at_head))
                        })
                    })
                    .await?;
            folded += count;
            if swapped {
                return Ok(folded);
            }
        }
    }
}
