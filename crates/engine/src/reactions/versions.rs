//! Versions: nothing waits to run at a version of its kind that is no
//! longer current. When a kind's new version is declared, every task of it
//! that nobody holds (pending, queued, retry_waiting, blocked) is requested
//! again at the new version in the same transaction, reason
//! `version_changed`; and a task that comes back to waiting later at the
//! old version — a claim of the old version that failed and will retry,
//! was interrupted, given back, or reopened from the review queue — is
//! moved the same way in the transaction that brings it back. A task a
//! worker holds finishes at the version it claimed (its result then reads
//! `stale`). The decision is the domain's (`opledger_domain::versions`).
//!
//! It reads nothing unless the events declared a new version or moved a
//! task back to waiting; then the kinds' declarations by key, and for a
//! declaration the kind's waiting tasks by status.

use super::follows;
use crate::error::EngineError;
use opledger_domain::kinds::{KindChange, KindDeclaration};
use opledger_domain::projections::{
    media_key, region_key, state_key, state_table, Cell, MediaRow, ProcessingStateRow, RegionRow, Row, WorkingSet,
    MEDIA_TABLE, REGIONS_TABLE, TASK_KINDS_TABLE,
};
use opledger_domain::requests::target_values;
use opledger_domain::tasks::TargetType;
use opledger_domain::versions::{decide_version_change, is_behind, WAITING_STATUSES};
use opledger_domain::{Event, EventEnvelope, MediaId, OperationId, RegionId, StreamId};
use opledger_store::{ExpectedVersion, StreamAppend, WriteTx};
use std::collections::BTreeMap;

pub(super) async fn retarget<T: WriteTx>(
    tx: &mut T,
    rows: &WorkingSet,
    envelopes: &[EventEnvelope],
) -> Result<Vec<StreamAppend>, EngineError> {
    let mut declared: BTreeMap<String, (KindDeclaration, &EventEnvelope)> = BTreeMap::new();
    let mut moved: BTreeMap<OperationId, (ProcessingStateRow, &EventEnvelope)> = BTreeMap::new();
    for envelope in envelopes {
        match &envelope.event {
            Event::TaskKindDeclared(kind) if kind.change == KindChange::NewVersion => {
                declared.insert(kind.declaration.name.clone(), ((*kind.declaration).clone(), envelope));
            }
            // Created and requested at the version the command read in
            // this transaction: current already.
            Event::OperationCreated(_) => {}
            Event::OperationRevisionRequested(requested) if requested.task_version.is_some() => {}
            event => {
                let Some(operation_id) = event.operation_id().filter(|_| event.cause().is_some()) else {
                    continue;
                };
                if let Some(state) = waiting_state(rows, operation_id) {
                    moved.insert(operation_id, (state, envelope));
                }
            }
        }
    }
    if declared.is_empty() && moved.is_empty() {
        return Ok(Vec::new());
    }
    // The kinds of the moved tasks, as declared now.
    let mut kinds: BTreeMap<String, KindDeclaration> = declared
        .iter()
        .map(|(name, (declaration, _))| (name.clone(), declaration.clone()))
        .collect();
    let unknown: Vec<String> = moved
        .values()
        .map(|(state, _)| state.task_kind.clone())
        .filter(|name| !kinds.contains_key(name))
        .collect();
    if !unknown.is_empty() {
        for row in tx.load_rows(&TASK_KINDS_TABLE, &unknown).await? {
            if let Row::TaskKind(kind) = row {
                if let Some(declaration) = kind.declaration {
                    kinds.insert(kind.name, declaration);
                }
            }
        }
    }
    let mut behind: Vec<(ProcessingStateRow, &EventEnvelope)> = moved
        .into_values()
        .filter(|(state, _)| kinds.get(&state.task_kind).is_some_and(|kind| is_behind(kind, state)))
        .collect();
    for (declaration, envelope) in declared.values() {
        for state in waiting_of_kind(tx, rows, declaration).await? {
            let listed = behind.iter().any(|(held, _)| held.operation_id == state.operation_id);
            if is_behind(declaration, &state) && !listed {
                behind.push((state, *envelope));
            }
        }
    }
    if behind.is_empty() {
        return Ok(Vec::new());
    }
    let targets = Targets::load(tx, rows, behind.iter().map(|(state, _)| state)).await?;
    let mut appends = Vec::with_capacity(behind.len());
    for (state, envelope) in behind {
        let (Some(kind), Some(values)) = (kinds.get(&state.task_kind), targets.values_of(&state)) else {
            continue;
        };
        if let Some(event) = decide_version_change(kind, &state, &values) {
            appends.push(StreamAppend {
                stream_id: StreamId::operation(state.operation_id),
                expected: ExpectedVersion::Exactly(state.version),
                events: vec![follows(envelope, event)],
            });
        }
    }
    Ok(appends)
}

/// The processing state the events left `operation_id` in, when it waits.
fn waiting_state(rows: &WorkingSet, operation_id: OperationId) -> Option<ProcessingStateRow> {
    [TargetType::Media, TargetType::Region].into_iter().find_map(|target| {
        match rows.get(&state_key(target, operation_id)) {
            Some(Row::ProcessingState(state)) if WAITING_STATUSES.contains(&state.status) => Some(state.clone()),
            _ => None,
        }
    })
}

/// Every task of `kind` that waits, as this transaction sees it (a row the
/// working set holds is newer than the stored one).
async fn waiting_of_kind<T: WriteTx>(
    tx: &mut T,
    rows: &WorkingSet,
    kind: &KindDeclaration,
) -> Result<Vec<ProcessingStateRow>, EngineError> {
    let mut waiting = Vec::new();
    for status in WAITING_STATUSES {
        let filters = [
            ("task_kind", Cell::Text(kind.name.clone())),
            ("status", Cell::Text(status.as_str().to_string())),
        ];
        for row in tx.find_rows(state_table(kind.target), &filters, usize::MAX).await? {
            if let Row::ProcessingState(stored) = row {
                let state = match rows.get(&state_key(stored.target_type, stored.operation_id)) {
                    Some(Row::ProcessingState(newer)) => newer.clone(),
                    _ => stored,
                };
                if WAITING_STATUSES.contains(&state.status) {
                    waiting.push(state);
                }
            }
        }
    }
    Ok(waiting)
}

/// The items and regions the re-targeted tasks run on: what fills their
/// inputs from the target.
struct Targets {
    media: BTreeMap<MediaId, MediaRow>,
    regions: BTreeMap<RegionId, RegionRow>,
}

impl Targets {
    async fn load<'a, T: WriteTx>(
        tx: &mut T,
        rows: &WorkingSet,
        states: impl Iterator<Item = &'a ProcessingStateRow>,
    ) -> Result<Self, EngineError> {
        let mut targets = Targets {
            media: BTreeMap::new(),
            regions: BTreeMap::new(),
        };
        let (mut media_ids, mut region_ids) = (Vec::new(), Vec::new());
        for state in states {
            match (state.media_id(), state.region_id()) {
                (Some(media_id), _) => media_ids.push(media_id),
                (_, Some(region_id)) => region_ids.push(region_id),
                _ => {}
            }
        }
        let mut unknown = Vec::new();
        for region_id in region_ids {
            match rows.get(&region_key(region_id)) {
                Some(Row::Region(region)) => {
                    targets.regions.insert(region_id, region.clone());
                }
                _ => unknown.push(region_id.to_string()),
            }
        }
        for row in load_chunked(tx, &REGIONS_TABLE, unknown).await? {
            if let Row::Region(region) = row {
                targets.regions.insert(region.region_id, region);
            }
        }
        media_ids.extend(targets.regions.values().map(|region| region.media_id));
        media_ids.sort();
        media_ids.dedup();
        let mut unknown = Vec::new();
        for media_id in media_ids {
            match rows.get(&media_key(media_id)) {
                Some(Row::Media(item)) => {
                    targets.media.insert(media_id, item.clone());
                }
                _ => unknown.push(media_id.to_string()),
            }
        }
        for row in load_chunked(tx, &MEDIA_TABLE, unknown).await? {
            if let Row::Media(item) = row {
                targets.media.insert(item.media_id, item);
            }
        }
        Ok(targets)
    }

    /// What `state`'s target fills into its inputs; `None` when the target
    /// is gone.
    fn values_of(&self, state: &ProcessingStateRow) -> Option<serde_json::Map<String, serde_json::Value>> {
        let region = state.region_id().map(|region_id| self.regions.get(&region_id));
        let media_id = match region {
            Some(region) => region?.media_id,
            None => state.media_id()?,
        };
        let item = self.media.get(&media_id)?;
        Some(target_values(item, region.flatten()))
    }
}

/// Rows of `table` by key, read in chunks so a large re-targeting stays
/// within a statement's parameter limit.
async fn load_chunked<T: WriteTx>(
    tx: &mut T,
    table: &'static opledger_domain::projections::TableSpec,
    keys: Vec<String>,
) -> Result<Vec<Row>, EngineError> {
    let mut loaded = Vec::new();
    for chunk in keys.chunks(500) {
        loaded.extend(tx.load_rows(table, chunk).await?);
    }
    Ok(loaded)
}
