//! The reads an ingest plans with: the latest ingestion and the media
//! item at each of a set of paths, media items and task states by id, and
//! every path the operations name. Each is an indexed, batched lookup on a
//! read connection, never a read of the whole table; none writes.

use crate::error::EngineError;
use crate::Engine;
use opledger_domain::projections::{
    media_key, Cell, MediaRow, OperationRow, ProcessingStateRow, Row, TableSpec, INGESTION_FILE, MEDIA_STATES_TABLE,
    MEDIA_TABLE, OPERATIONS_TABLE,
};
use opledger_domain::{MediaId, OperationId};
use opledger_store::Store;
use std::collections::{BTreeMap, BTreeSet};

impl<S: Store> Engine<S> {
    /// The latest `ingestion.file` operation of each of `paths` that has
    /// one (latest by creation time, then by id): an indexed lookup of
    /// these paths, not a read of every ingestion.
    pub async fn ingestions_by_path(&self, paths: &[String]) -> Result<BTreeMap<String, OperationRow>, EngineError> {
        let mut latest: BTreeMap<String, OperationRow> = BTreeMap::new();
        for row in self.rows_with_text_in(&OPERATIONS_TABLE, "path", paths).await? {
            let Row::Operation(operation) = row else { continue };
            if operation.kind != INGESTION_FILE {
                continue;
            }
            let Some(path) = operation.path.clone() else { continue };
            match latest.get(&path) {
                Some(known)
                    if (known.created_at, known.operation_id) >= (operation.created_at, operation.operation_id) => {}
                _ => {
                    latest.insert(path, operation);
                }
            }
        }
        Ok(latest)
    }

    /// The media item at each of `paths` that has one: an indexed lookup
    /// of these paths. Of several items at one path, the last by id (what
    /// a read of the table in key order leaves).
    pub async fn media_by_path(&self, paths: &[String]) -> Result<BTreeMap<String, MediaRow>, EngineError> {
        let mut found = BTreeMap::new();
        for media in self.media_at(paths).await? {
            found.insert(media.path.clone(), media);
        }
        Ok(found)
    }

    /// Media items by id (absent ones are missing from the answer).
    pub async fn media_by_id(&self, ids: &[MediaId]) -> Result<BTreeMap<MediaId, MediaRow>, EngineError> {
        let mut found = BTreeMap::new();
        for chunk in ids.chunks(500) {
            let keys: Vec<String> = chunk.iter().map(|id| media_key(*id).key.to_string()).collect();
            for row in self.store.load_rows(&MEDIA_TABLE, &keys).await? {
                if let Row::Media(media) = row {
                    found.insert(media.media_id, media);
                }
            }
        }
        Ok(found)
    }

    /// Every path an operation names (a file ingestion names its file),
    /// each once: what an ingest compares with a folder to find the files
    /// that are gone. One short column per operation, grouped by the store.
    pub async fn operation_paths(&self) -> Result<BTreeSet<String>, EngineError> {
        Ok(self
            .store
            .count_by(&OPERATIONS_TABLE, "path")
            .await?
            .into_iter()
            .filter_map(|(path, _)| path)
            .collect())
    }

    /// The processing states of these task operations (absent ones are
    /// missing from the answer).
    pub async fn media_task_states(&self, operations: &[OperationId]) -> Result<Vec<ProcessingStateRow>, EngineError> {
        let mut states = Vec::with_capacity(operations.len());
        for chunk in operations.chunks(500) {
            let keys: Vec<String> = chunk.iter().map(|id| id.to_string()).collect();
            for row in self.store.load_rows(&MEDIA_STATES_TABLE, &keys).await? {
                if let Row::ProcessingState(state) = row {
                    states.push(state);
                }
            }
        }
        Ok(states)
    }

    /// The media item at each of `paths` that has one; of several items at
    /// one path, the first by id (the item a registration updates).
    pub(super) async fn media_by_paths(&self, paths: Vec<String>) -> Result<BTreeMap<String, MediaRow>, EngineError> {
        let mut found = BTreeMap::new();
        for media in self.media_at(&paths).await? {
            found.entry(media.path.clone()).or_insert(media);
        }
        Ok(found)
    }

    /// Every media item at one of `paths`, in id order.
    async fn media_at(&self, paths: &[String]) -> Result<Vec<MediaRow>, EngineError> {
        Ok(self
            .rows_with_text_in(&MEDIA_TABLE, "path", paths)
            .await?
            .into_iter()
            .filter_map(|row| match row {
                Row::Media(media) => Some(media),
                _ => None,
            })
            .collect())
    }

    /// Rows of `table` whose text `column` is one of `values`, in one
    /// batched lookup on a read connection.
    async fn rows_with_text_in(
        &self,
        table: &'static TableSpec,
        column: &'static str,
        values: &[String],
    ) -> Result<Vec<Row>, EngineError> {
        if values.is_empty() {
            return Ok(Vec::new());
        }
        let cells: Vec<Cell> = values.iter().cloned().map(Cell::Text).collect();
        Ok(self.store.find_rows_in(table, column, &cells).await?)
    }
}
