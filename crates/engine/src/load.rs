//! Loaders commands share inside their transaction: the rows a decision
//! reads, by key, recorded in the command's working set so the fold of its
//! appends reuses them instead of reading them again.

use crate::error::EngineError;
use opledger_domain::projections::{
    media_key, operation_key, task_kind_key, Cell, MediaRow, OperationRow, Row, RowKey, TaskKindRow, WorkingSet,
    CAPABILITY_STATES_TABLE, MEDIA_TABLE, OPERATIONS_TABLE, TASK_KINDS_TABLE,
};
use opledger_domain::{CapabilityStatus, MediaId, OperationId};
use opledger_store::WriteTx;
use std::collections::{BTreeMap, BTreeSet};

/// One operation's row; NotFound when there is none.
pub(crate) async fn load_operation<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    operation_id: OperationId,
) -> Result<OperationRow, EngineError> {
    let key = operation_key(operation_id);
    let loaded = tx.load_rows(&OPERATIONS_TABLE, &[key.key.to_string()]).await?;
    match loaded.into_iter().next() {
        Some(Row::Operation(row)) => {
            rows.insert_loaded(key, Some(Row::Operation(row.clone())));
            Ok(row)
        }
        _ => Err(EngineError::not_found("operation", operation_id)),
    }
}

/// The operation rows of these ids (absent ones are missing from the map),
/// reusing rows the working set already knows.
pub(crate) async fn load_operations<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    operation_ids: &[OperationId],
) -> Result<BTreeMap<OperationId, OperationRow>, EngineError> {
    let unknown: Vec<String> = operation_ids
        .iter()
        .map(|id| operation_key(*id))
        .filter(|key| !rows.is_known(key))
        .map(|key| key.key.to_string())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if !unknown.is_empty() {
        let loaded = tx.load_rows(&OPERATIONS_TABLE, &unknown).await?;
        for key in unknown {
            rows.insert_loaded(RowKey::new(&OPERATIONS_TABLE, key), None);
        }
        for row in loaded {
            rows.insert_loaded(row.key(), Some(row));
        }
    }
    Ok(operation_ids
        .iter()
        .filter_map(|id| match rows.get(&operation_key(*id)) {
            Some(Row::Operation(operation)) => Some((*id, operation.clone())),
            _ => None,
        })
        .collect())
}

/// One media item's row; NotFound when there is none.
pub(crate) async fn load_media<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    media_id: MediaId,
) -> Result<MediaRow, EngineError> {
    let key = media_key(media_id);
    let loaded = tx.load_rows(&MEDIA_TABLE, &[key.key.to_string()]).await?;
    match loaded.into_iter().next() {
        Some(Row::Media(row)) => {
            rows.insert_loaded(key, Some(Row::Media(row.clone())));
            Ok(row)
        }
        _ => Err(EngineError::not_found("media", media_id)),
    }
}

/// The task kind rows of these names (absent ones are missing from the
/// map), loaded into the working set so the fold of the command's appends
/// finds them there.
pub(crate) async fn load_kinds<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    names: impl IntoIterator<Item = &str>,
) -> Result<BTreeMap<String, TaskKindRow>, EngineError> {
    let names: BTreeSet<String> = names.into_iter().map(str::to_string).collect();
    let unknown: Vec<String> = names
        .iter()
        .filter(|name| !rows.is_known(&task_kind_key(name)))
        .cloned()
        .collect();
    if !unknown.is_empty() {
        let loaded = tx.load_rows(&TASK_KINDS_TABLE, &unknown).await?;
        for name in &unknown {
            rows.insert_loaded(task_kind_key(name), None);
        }
        for row in loaded {
            rows.insert_loaded(row.key(), Some(row));
        }
    }
    Ok(names
        .into_iter()
        .filter_map(|name| match rows.get(&task_kind_key(&name)) {
            Some(Row::TaskKind(row)) => Some((name, row.clone())),
            _ => None,
        })
        .collect())
}

/// Each capability's status on these media items, by (item, capability),
/// as this transaction sees them (a row the working set holds is newer than
/// the stored one). A capability no work was requested for is absent.
pub(crate) async fn capability_statuses<T: WriteTx>(
    tx: &mut T,
    rows: &WorkingSet,
    media_ids: &BTreeSet<MediaId>,
) -> Result<BTreeMap<(MediaId, String), CapabilityStatus>, EngineError> {
    if media_ids.is_empty() {
        return Ok(BTreeMap::new());
    }
    let values: Vec<Cell> = media_ids.iter().map(|id| Cell::Uuid(id.0)).collect();
    let mut statuses = BTreeMap::new();
    for stored in tx.find_rows_in(&CAPABILITY_STATES_TABLE, "media_id", &values).await? {
        let row = match rows.get(&stored.key()) {
            Some(newer) => newer,
            None => &stored,
        };
        if let Row::Capability(capability) = row {
            statuses.insert((capability.media_id, capability.capability.clone()), capability.status);
        }
    }
    Ok(statuses)
}

/// Every task kind row, in name order.
pub(crate) async fn all_kinds<T: WriteTx>(tx: &mut T) -> Result<Vec<TaskKindRow>, EngineError> {
    let mut kinds: Vec<TaskKindRow> = tx
        .find_rows(&TASK_KINDS_TABLE, &[], usize::MAX)
        .await?
        .into_iter()
        .filter_map(|row| match row {
            Row::TaskKind(row) => Some(row),
            _ => None,
        })
        .collect();
    kinds.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(kinds)
}

/// The refusal of a kind that is not declared, naming (the first of) those
/// that are.
pub(crate) fn undeclared(name: &str, kinds: &[TaskKindRow]) -> EngineError {
    opledger_domain::kinds::undeclared(name, &declared_names(kinds)).into()
}

/// The names of the kinds that are declared.
pub(crate) fn declared_names(kinds: &[TaskKindRow]) -> Vec<String> {
    kinds
        .iter()
        .filter(|row| row.declared)
        .map(|row| row.name.clone())
        .collect()
}
