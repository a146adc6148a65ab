//! Loaders commands share inside their transaction: the rows a decision
//! reads, by key, recorded in the command's working set so the fold of its
//! appends reuses them instead of reading them again.

use crate::error::EngineError;
use opledger_domain::projections::{
    media_key, operation_key, MediaRow, OperationRow, Row, RowKey, WorkingSet, MEDIA_TABLE, OPERATIONS_TABLE,
};
use opledger_domain::{MediaId, OperationId};
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
