//! The rows an export's fold has written back, held compactly in memory:
//! each row as its cells encoded by `postcard`, in key order per table.
//! The fold keeps only a bounded cache of rows whole (as replay does) and
//! writes every changed row back here, so what an export holds for each
//! row is a few hundred bytes rather than the row's whole in-memory form
//! (about three times as much for an operation, with its strings each a
//! separate allocation). It is the fold's [`RowTarget`], so the export's
//! fold is the engine's own [`opledger_engine::fold_events`], the routine
//! replay runs.

use opledger_domain::projections::{table_by_name, Cell, Key, Row, RowChange, RowKey, TableSpec};
use opledger_domain::Timestamp;
use opledger_store::{RowTarget, StoreError};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use uuid::Uuid;

/// One cell as encoded: [`Cell`] with a time as its microseconds and
/// text borrowed while encoding.
#[derive(Serialize, Deserialize)]
enum Encoded<'a> {
    Null,
    Integer(i64),
    Real(f64),
    Text(#[serde(borrow)] Cow<'a, str>),
    Bool(bool),
    Timestamp(i64),
    Uuid([u8; 16]),
    Json(#[serde(borrow)] Cow<'a, str>),
}

impl<'a> Encoded<'a> {
    fn of(cell: &'a Cell) -> Self {
        match cell {
            Cell::Null => Encoded::Null,
            Cell::Integer(value) => Encoded::Integer(*value),
            Cell::Real(value) => Encoded::Real(*value),
            Cell::Text(value) => Encoded::Text(Cow::Borrowed(value)),
            Cell::Bool(value) => Encoded::Bool(*value),
            Cell::Timestamp(at) => Encoded::Timestamp(at.as_micros()),
            Cell::Uuid(id) => Encoded::Uuid(id.into_bytes()),
            Cell::Json(value) => Encoded::Json(Cow::Borrowed(value)),
        }
    }

    fn cell(self) -> Cell {
        match self {
            Encoded::Null => Cell::Null,
            Encoded::Integer(value) => Cell::Integer(value),
            Encoded::Real(value) => Cell::Real(value),
            Encoded::Text(value) => Cell::Text(value.into_owned()),
            Encoded::Bool(value) => Cell::Bool(value),
            Encoded::Timestamp(micros) => Cell::Timestamp(Timestamp::from_micros(micros)),
            Encoded::Uuid(bytes) => Cell::Uuid(Uuid::from_bytes(bytes)),
            Encoded::Json(value) => Cell::Json(value.into_owned()),
        }
    }
}

fn encode(row: &Row) -> Box<[u8]> {
    let cells = row.to_cells();
    let encoded: Vec<Encoded<'_>> = cells.iter().map(Encoded::of).collect();
    postcard::to_allocvec(&encoded)
        .expect("cells always encode")
        .into_boxed_slice()
}

fn decode(table: &'static TableSpec, bytes: &[u8]) -> Result<Row, StoreError> {
    let encoded: Vec<Encoded<'_>> = postcard::from_bytes(bytes).map_err(|error| {
        StoreError::corrupt(format!(
            "an export's folded {} row does not decode: {error}",
            table.name
        ))
    })?;
    Row::from_cells(table, encoded.into_iter().map(Encoded::cell).collect())
        .map_err(|error| StoreError::corrupt(format!("an export's folded {} row: {error}", table.name)))
}

/// Every row written back, per table, in key order.
#[derive(Debug, Default)]
pub struct SpilledRows {
    tables: BTreeMap<&'static str, BTreeMap<Key, Box<[u8]>>>,
    /// The rows held whose parent is each row (a media item's regions,
    /// states and capabilities, a batch's items), so a deleted row takes
    /// its descendants with it as the stores' ON DELETE CASCADE does.
    children: BTreeMap<RowKey, BTreeSet<RowKey>>,
}

impl SpilledRows {
    /// Rows held, over every table.
    pub fn len(&self) -> usize {
        self.tables.values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows of `table` held.
    pub fn count(&self, table: &TableSpec) -> usize {
        self.tables.get(table.name).map_or(0, BTreeMap::len)
    }

    /// The rows of `table` in key order, each decoded as it is reached.
    pub fn rows(&self, table: &'static TableSpec) -> impl Iterator<Item = Result<Row, StoreError>> + '_ {
        self.tables
            .get(table.name)
            .into_iter()
            .flat_map(|rows| rows.values())
            .map(move |bytes| decode(table, bytes))
    }

    fn get(&self, table: &'static TableSpec, key: &Key) -> Option<Result<Row, StoreError>> {
        let bytes = self.tables.get(table.name)?.get(key)?;
        Some(decode(table, bytes))
    }

    fn upsert(&mut self, key: &RowKey, row: &Row) {
        if let Some(parent) = row.parent() {
            self.children.entry(parent).or_default().insert(key.clone());
        }
        self.tables
            .entry(key.table)
            .or_default()
            .insert(key.key.clone(), encode(row));
    }

    /// Deletes a row and, by cascade, its descendants.
    fn delete(&mut self, key: &RowKey) -> Result<(), StoreError> {
        let Some(bytes) = self.tables.get_mut(key.table).and_then(|rows| rows.remove(&key.key)) else {
            return Ok(());
        };
        let table = table_by_name(key.table)
            .ok_or_else(|| StoreError::corrupt(format!("a fold named unknown table {}", key.table)))?;
        if let Some(parent) = decode(table, &bytes)?.parent() {
            if let Some(siblings) = self.children.get_mut(&parent) {
                siblings.remove(key);
            }
        }
        self.cascade(key)
    }

    fn cascade(&mut self, parent: &RowKey) -> Result<(), StoreError> {
        for child in self.children.remove(parent).unwrap_or_default() {
            if let Some(rows) = self.tables.get_mut(child.table) {
                rows.remove(&child.key);
            }
            self.cascade(&child)?;
        }
        Ok(())
    }
}

impl RowTarget for SpilledRows {
    async fn load_rows(&mut self, table: &'static TableSpec, keys: &[String]) -> Result<Vec<Row>, StoreError> {
        keys.iter()
            .filter_map(|text| self.get(table, &Key::from_text(text)))
            .collect()
    }

    async fn load_rows_where(
        &mut self,
        table: &'static TableSpec,
        column: &'static str,
        value: &Cell,
    ) -> Result<Vec<Row>, StoreError> {
        let index = table
            .column_names()
            .position(|name| name == column)
            .ok_or_else(|| StoreError::corrupt(format!("a fold asked {} for unknown column {column}", table.name)))?;
        // A scan: folds ask this only before a deletion cascades (a media
        // item removed, a kind redeclared), rare beside the events.
        let mut found = Vec::new();
        for row in self.rows(table) {
            let row = row?;
            if row.to_cells().get(index) == Some(value) {
                found.push(row);
            }
        }
        Ok(found)
    }

    /// Writes first, then deletes with their cascades, as the stores do.
    async fn write_rows(&mut self, changes: &[RowChange]) -> Result<(), StoreError> {
        for change in changes {
            if let Some(row) = &change.after {
                self.upsert(&change.key, row);
            }
        }
        for change in changes.iter().filter(|change| change.after.is_none()) {
            self.delete(&change.key)?;
        }
        Ok(())
    }
}
