//! Marking what a new version of a kind made out of date: each task
//! operation of the kind requested at another version gets
//! `task_version_changed`, so that a result it holds reads `stale` until
//! the work is requested at the current version. Idempotent: one grouped
//! count by `kind@version` finds nothing to do once every row is marked.

use crate::error::EngineError;
use crate::tx::{CommandContext, Decided};
use crate::Engine;
use opledger_domain::events::{Event, TaskVersionChanged};
use opledger_domain::projections::{version_key, CapabilityRow, Cell, Row, CAPABILITY_STATES_TABLE};
use opledger_domain::StreamId;
use opledger_store::{ExpectedVersion, Store, StreamAppend};

/// Operations marked per transaction.
const STALE_BATCH: usize = 1_000;

impl<S: Store> Engine<S> {
    /// Records, on each task operation requested at a version of its kind
    /// other than the declared one, that the version changed. Run by
    /// [`Engine::maintain`] and at startup; `kinds apply` does the same for
    /// the kinds it bumps. Returns how many operations it marked.
    pub async fn sweep_task_versions(&self, context: &CommandContext) -> Result<usize, EngineError> {
        let kinds = self.task_kinds().await?;
        let mut marked = 0;
        for kind in kinds.iter().filter(|kind| kind.declared && kind.capability.is_some()) {
            marked += self.mark_kind(context, &kind.name, &kind.kind_version).await?.0;
        }
        Ok(marked)
    }

    /// Marks the operations of `kind` requested at another version than
    /// `current`; returns how many of them hold a result (now `stale`).
    pub(crate) async fn mark_stale(
        &self,
        context: &CommandContext,
        kind: &str,
        current: &str,
    ) -> Result<usize, EngineError> {
        Ok(self.mark_kind(context, kind, current).await?.1)
    }

    /// How many capabilities of `kind` hold a result of another version
    /// than `current` (what [`Engine::mark_stale`] would make stale).
    pub(crate) async fn count_stale(&self, kind: &str, current: &str) -> Result<usize, EngineError> {
        let mut with_results = 0;
        for key in self.other_version_keys(kind, current).await? {
            let rows = self
                .store
                .find_rows(
                    &CAPABILITY_STATES_TABLE,
                    &[("version_key", Cell::Text(key))],
                    usize::MAX,
                )
                .await?;
            with_results += rows
                .iter()
                .filter(|row| matches!(row, Row::Capability(row) if row.produced_version.is_some()))
                .count();
        }
        Ok(with_results)
    }

    /// The `kind@version` keys of `kind`'s capability rows at other
    /// versions than `current`.
    async fn other_version_keys(&self, kind: &str, current: &str) -> Result<Vec<String>, EngineError> {
        let counted = self.store.count_by(&CAPABILITY_STATES_TABLE, "version_key").await?;
        let prefix = format!("{kind}@");
        let current = version_key(kind, Some(current));
        Ok(counted
            .into_iter()
            .filter_map(|(key, _)| key)
            .filter(|key| key.starts_with(&prefix) && *key != current)
            .collect())
    }

    /// Marks in chunks; returns (operations marked, of them with a result).
    async fn mark_kind(
        &self,
        context: &CommandContext,
        kind: &str,
        current: &str,
    ) -> Result<(usize, usize), EngineError> {
        let mut marked = 0;
        let mut with_results = 0;
        for key in self.other_version_keys(kind, current).await? {
            loop {
                let changed: Vec<CapabilityRow> = self
                    .store
                    .find_rows(
                        &CAPABILITY_STATES_TABLE,
                        &[("version_key", Cell::Text(key.clone()))],
                        STALE_BATCH,
                    )
                    .await?
                    .into_iter()
                    .filter_map(|row| match row {
                        Row::Capability(capability) => Some(capability),
                        _ => None,
                    })
                    .collect();
                if changed.is_empty() {
                    break;
                }
                marked += changed.len();
                with_results += changed.iter().filter(|row| row.produced_version.is_some()).count();
                let stamp = self.stamp(context);
                let current = current.to_string();
                self.stamped(stamp, move |_, _, stamp| {
                    Box::pin(async move {
                        let appends = changed
                            .into_iter()
                            .map(|capability| StreamAppend {
                                stream_id: StreamId::operation(capability.operation_id),
                                expected: ExpectedVersion::Exactly(capability.version),
                                events: vec![stamp.event(Event::TaskVersionChanged(TaskVersionChanged {
                                    operation_id: capability.operation_id,
                                    previous_version: capability.current_version.clone(),
                                    current_version: current.clone(),
                                    produced_version: capability.produced_version.clone(),
                                }))],
                            })
                            .collect();
                        Ok(Decided::answer((), appends))
                    })
                })
                .await?;
            }
        }
        Ok((marked, with_results))
    }
}
