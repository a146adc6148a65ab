//! Runs the domain's folds against a store target: load the rows the events
//! touch, fold in memory, write back what changed. One routine serves the
//! inline path, startup catch-up, shadow rebuilds and replay, so they cannot
//! disagree about what an event does.

use crate::error::EngineError;
use opledger_domain::projections::{
    rows_owned_by, table_by_name, Key, Projector, RowKey, RowQuery, TableSpec, WorkingSet,
};
use opledger_domain::EventEnvelope;
use opledger_store::{RowTarget, StoreError};
use std::collections::{BTreeMap, BTreeSet};

/// Events folded per store round trip when catching up or replaying.
pub const FOLD_CHUNK: usize = 10_000;

/// Folds `events` (in seq order) into `target` with `projectors`, using
/// `rows` as the cache of known rows. Writes every changed row before
/// returning; the cache keeps the rows for the next call.
pub async fn fold_events<T: RowTarget>(
    target: &mut T,
    rows: &mut WorkingSet,
    projectors: &[&dyn Projector],
    events: &[EventEnvelope],
) -> Result<(), EngineError> {
    let mut keys: Vec<RowKey> = Vec::new();
    let mut owned: Vec<RowKey> = Vec::new();
    let mut queries: Vec<RowQuery> = Vec::new();
    for event in events {
        // A stream's first event: the row it owns does not exist yet.
        if event.stream_version == 1 {
            owned.clear();
            rows_owned_by(&event.stream_id, &mut owned);
            for key in owned.drain(..) {
                if !rows.is_known(&key) {
                    rows.insert_loaded(key, None);
                }
            }
        }
        // Only keys the working set does not know are kept: a chunk names
        // about eight rows per event, nearly all known, and collecting them
        // all first grew a vector of tens of thousands of keys per chunk.
        let start = keys.len();
        for projector in projectors {
            projector.keys(event, &mut keys);
            projector.queries(event, &mut queries);
        }
        let mut kept = start;
        for index in start..keys.len() {
            if !rows.is_known(&keys[index]) {
                keys.swap(kept, index);
                kept += 1;
            }
        }
        keys.truncate(kept);
    }
    // Rows found by query join the cache unless it already knows them: a
    // cached row may be newer than its stored copy (changed earlier in this
    // chunk), and a known-absent one was deleted.
    for query in &queries {
        for row in target.load_rows_where(query.table, query.column, &query.value).await? {
            let key = row.key();
            if !rows.is_known(&key) {
                rows.insert_loaded(key, Some(row));
            }
        }
    }
    let mut missing: BTreeMap<&'static str, BTreeSet<Key>> = BTreeMap::new();
    for key in keys {
        if !rows.is_known(&key) {
            missing.entry(key.table).or_default().insert(key.key);
        }
    }
    let mut requests = Vec::with_capacity(missing.len());
    for (table_name, keys) in missing {
        let table = table_by_name(table_name)
            .ok_or_else(|| StoreError::corrupt(format!("a fold named unknown table {table_name}")))?;
        requests.push((table, keys));
    }
    if !requests.is_empty() {
        let texts: Vec<(&'static TableSpec, Vec<String>)> = requests
            .iter()
            .map(|(table, keys)| (*table, keys.iter().map(Key::to_string).collect()))
            .collect();
        // Every table at once: one round trip where a statement is one.
        let loaded = target.load_rows_of_tables(&texts).await?;
        for (table, keys) in requests {
            for key in keys {
                rows.insert_loaded(RowKey { table: table.name, key }, None);
            }
        }
        for row in loaded {
            rows.insert_loaded(row.key(), Some(row));
        }
    }
    let applied_at = std::time::Instant::now();
    for event in events {
        for projector in projectors {
            projector.apply(event, rows)?;
        }
    }
    let changes = rows.take_dirty();
    let written_at = std::time::Instant::now();
    if !changes.is_empty() {
        target.write_rows(&changes).await?;
    }
    tracing::trace!(
        events = events.len(),
        changes = changes.len(),
        apply_us = (written_at - applied_at).as_micros() as u64,
        write_us = written_at.elapsed().as_micros() as u64,
        "fold"
    );
    Ok(())
}
